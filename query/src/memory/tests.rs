use super::*;

#[test]
fn queries_keep_to_their_own_limit_and_to_the_shared_pool() {
    // 1000 bytes: 500 for all queries together.
    let ceiling = Ceiling::new(1000);
    let a = ceiling.query_pool(Some(300));
    let b = ceiling.query_pool(Some(300));
    let ra = MemoryConsumer::new("a").register(&a);
    let rb = MemoryConsumer::new("b").register(&b);
    ra.try_grow(300).expect("a within its own limit");
    ra.try_grow(1).expect_err("a over its own limit");
    rb.try_grow(200).expect("b within the shared pool");
    let err = rb.try_grow(100).expect_err("the shared pool is full");
    assert!(
        matches!(err, DataFusionError::ResourcesExhausted(_)),
        "{err}"
    );
    assert_eq!(ceiling.stats().query_reserved, 500);
    drop(ra);
    rb.try_grow(100).expect("room again once a is gone");
    assert_eq!(b.reserved(), 300);
}

#[tokio::test]
async fn resident_memory_stops_and_resumes_queries() {
    let ceiling = Ceiling::new(1000);
    let mut stops = ceiling.stops();
    // A decode in flight: the server holds work it accounts for.
    let mut decoding = ceiling.reserve_decode();
    decoding.inflated(1).expect("room");
    ceiling.observe(100, 100);
    ceiling.admit_query().expect("far under");
    ceiling.admit_write().expect("far under");
    assert!(!stops.has_changed().expect("open"));

    ceiling.observe(860, 860);
    assert_eq!(
        ceiling.admit_query(),
        Err(Pressure {
            used: 860,
            limit: 1000
        })
    );
    ceiling.admit_write().expect("writes go on until 95%");
    assert!(
        stops.has_changed().expect("open"),
        "running queries told to stop"
    );
    stops.borrow_and_update();

    // Between the marks: still refused (no flapping).
    ceiling.observe(800, 860);
    ceiling
        .admit_query()
        .expect_err("not under the resume mark yet");
    ceiling.observe(960, 960);
    ceiling.admit_write().expect_err("writes refused at 95%");
    assert!(stops.has_changed().expect("open"));

    ceiling.observe(700, 960);
    ceiling.admit_query().expect("under the resume mark");
    ceiling.admit_write().expect("writes again");
    let stats = ceiling.stats();
    assert_eq!(stats.peak, 960);
    assert_eq!(stats.queries_refused, 2);
    assert_eq!(stats.writes_refused, 1);
}

#[test]
fn an_idle_server_never_refuses_on_resident_memory_alone() {
    let ceiling = Ceiling::new(1000);
    ceiling.observe(990, 990);
    ceiling.admit_query().expect("nothing accounted in flight");
    ceiling.admit_write().expect("nothing accounted in flight");
    let mut decoding = ceiling.reserve_decode();
    decoding.inflated(1).expect("room");
    ceiling.admit_query().expect_err("a decode in flight");
    drop(decoding);
    ceiling.admit_query().expect("idle again");
}

#[test]
fn decodes_reserve_before_they_inflate_and_give_it_back() {
    // 200 of 1000 bytes for decoding writes.
    let ceiling = Ceiling::new(1000 * DECODE_FACTOR);
    assert_eq!(ceiling.decode_bytes(), 200 * DECODE_FACTOR);
    let mut a = ceiling.reserve_decode();
    let mut b = ceiling.reserve_decode();
    a.inflated(150).expect("a fits");
    let busy = b.inflated(100).expect_err("room held by a");
    assert!(!busy.never_fits(), "{busy}");
    assert_eq!(busy.held, 150 * DECODE_FACTOR);
    assert!(busy.to_string().contains("Retry-After"), "{busy}");
    b.inflated(50).expect("what is left");
    assert_eq!(ceiling.stats().decode_reserved, 200 * DECODE_FACTOR);
    drop(a);
    drop(b);
    assert_eq!(ceiling.stats().decode_reserved, 0);
    let mut bomb = ceiling.reserve_decode();
    bomb.inflated(150).expect("fits");
    let never = bomb.inflated(100).expect_err("more than the share");
    assert!(never.never_fits(), "{never}");
    assert!(never.to_string().contains("split the batch"), "{never}");
    assert_eq!(ceiling.stats().decodes_refused, 2);
}

#[test]
fn pressure_survives_datafusion_error_wrapping() {
    let e = Pressure { used: 1, limit: 2 }.into_datafusion();
    let wrapped = DataFusionError::Context("while streaming".into(), Box::new(e));
    assert_eq!(
        Pressure::find(&wrapped),
        Some(Pressure { used: 1, limit: 2 })
    );
    let err = crate::Error::from(wrapped);
    assert_eq!(err.status(), crate::Status::Unavailable);
}

#[test]
fn proc_fields_parse() {
    let text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
    assert_eq!(kib_field(text, "VmRSS:"), Some(1024 * 1024));
    assert_eq!(kib_field(text, "VmHWM:"), Some(2048 * 1024));
    assert_eq!(kib_field(text, "VmSwap:"), None);
    assert_eq!(kib_field("VmRSS: lots kB", "VmRSS:"), None);
    let (rss, peak) = resident().expect("linux /proc");
    assert!(rss > 0 && peak >= rss);
    assert!(default_limit().expect("meminfo") > 0);
}

/// The metadata cache is a share of the ceiling (DataFusion's 50 MiB at least); the engine's
/// runtime has that size (`engine::tests`).
#[test]
fn the_metadata_cache_is_a_share_of_the_ceiling() {
    let gib = 1usize << 30;
    assert_eq!(
        metadata_cache_bytes(Some(&Ceiling::new(16 * gib))),
        16 * gib / 40
    );
    assert_eq!(
        metadata_cache_bytes(Some(&Ceiling::new(gib))),
        METADATA_CACHE_MIN
    );
    assert_eq!(metadata_cache_bytes(None), METADATA_CACHE_UNBOUNDED);
}
