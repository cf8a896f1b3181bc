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
