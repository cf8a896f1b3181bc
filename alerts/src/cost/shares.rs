//! Shared GPUs: when several jobs use one GPU in a sample (Kubernetes time-slicing, MPS, Slurm
//! shards), the agent sends each job's share (`job_shares`, docs/cost.md "Shared GPUs") and the
//! `jobs` view bills each its share of the sample's seconds and energy, so the jobs of a GPU add
//! up to the GPU, never more. Both SQL paths (the plain view and the ledger's live part) split
//! with [`split_sql`]; the ledger's fold splits the same way in Rust ([`shares_of`]).

use gpuwatch_store::schema::parse_job_shares;

use super::CHARGE_COLUMNS;

/// A job's own labels among `present` (the per-sample CTE's columns): on a shared sample only
/// the row's labelled job keeps them, the other jobs get null (their labels come from their own
/// rows), except `k8s_namespace`, which a pod's id `<namespace>/<pod>` gives.
fn own_labels<'a>(present: &[&'a str]) -> Vec<&'a str> {
    present
        .iter()
        .copied()
        .filter(|c| *c == "job_user" || *c == "job_name" || CHARGE_COLUMNS.contains(c))
        .collect()
}

/// `sh` and `d` after a CTE `d0` (one row per GPU sample with its labelled `job_id`,
/// `job_shares`, and `secs`, `joules` of the whole GPU): `d` has one row per job and sample,
/// with `secs` and `joules` that job's share and `held` the sample's whole seconds, then
/// `filter` (" AND …") applied. The shares come from their own scan, `source` (`<table> WHERE
/// <condition>` of the samples `d0` reads), of the rows that have any (statistics skip the rest),
/// left-joined to `d0`'s rows by GPU and time, so that the per-GPU windows are computed once.
/// A sample without valid shares is its job's whole; pairs that do not parse or are not above 0
/// are left out. The shares are taken as written: the server writes them normalised to add up
/// to 1 (`gpuwatch_store::schema::canonical_job_shares`).
pub(crate) fn split_sql(present: &[&str], source: &str, filter: &str) -> String {
    let own = own_labels(present);
    let excluded: Vec<&str> = ["job_id", "secs", "joules", "job_shares"]
        .into_iter()
        .chain(own.iter().copied())
        .collect();
    let excluded = excluded.join(", ");
    let labels: String = own
        .iter()
        .map(|c| {
            let pod_ns = if *c == "k8s_namespace" {
                format!(" WHEN scheduler = 'kubernetes' THEN split_part(sj, '/', 1)")
            } else {
                String::new()
            };
            format!(", CASE WHEN sj IS NULL OR sj = job_id THEN {c}{pod_ns} END AS {c}")
        })
        .collect();
    let positions: Vec<String> = (1..=gpuwatch_store::schema::MAX_JOB_SHARES)
        .map(|i| format!("({i})"))
        .collect();
    let positions = positions.join(", ");
    format!(
        r#"sh AS (
  SELECT sh_host, sh_gpu, sh_time, sj, max(sh0) AS sh FROM (
    SELECT sh_host, sh_gpu, sh_time, split_part(js, '=', 1) AS sj, TRY_CAST(split_part(js, '=', 2) AS DOUBLE) AS sh0
    FROM (SELECT host AS sh_host, gpu_uuid AS sh_gpu, time AS sh_time, split_part(job_shares, ',', k.i) AS js
          FROM (SELECT host, gpu_uuid, time, job_shares FROM {source} AND job_shares IS NOT NULL) g
          CROSS JOIN (VALUES {positions}) AS k(i)) x
  ) y WHERE sj <> '' AND sh0 > 0 AND sh0 <= 1
  GROUP BY sh_host, sh_gpu, sh_time, sj
), d AS (
  SELECT * FROM (
    SELECT * EXCLUDE ({excluded}, sh_host, sh_gpu, sh_time, sj, sh),
      COALESCE(sj, job_id) AS job_id, secs * COALESCE(sh, 1.0) AS secs,
      joules * COALESCE(sh, 1.0) AS joules, secs AS held{labels}
    FROM d0 LEFT JOIN sh ON host = sh_host AND gpu_uuid = sh_gpu AND time = sh_time
  ) z WHERE true{filter}
)"#
    )
}

/// Each job's share of a sample labelled with `job` and `shares` (its `job_shares`), as
/// [`split_sql`] takes them: `job` whole without valid shares, else the parsed shares above
/// 0, one per job.
pub(crate) fn shares_of<'a>(job: Option<&'a str>, shares: Option<&'a str>) -> Vec<(&'a str, f64)> {
    let whole = || job.map(|j| vec![(j, 1.0)]).unwrap_or_default();
    let Some(text) = shares else {
        return whole();
    };
    let mut pairs: Vec<(&str, f64)> = parse_job_shares(text)
        .into_iter()
        .filter(|(_, s)| *s > 0.0)
        .collect();
    // A job twice in one list counts once, at its largest share (as split_sql's max).
    pairs.sort_by(|a, b| a.0.cmp(b.0).then(b.1.total_cmp(&a.1)));
    pairs.dedup_by(|a, b| a.0 == b.0);
    if pairs.is_empty() { whole() } else { pairs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_normalised_and_a_sample_without_them_is_its_jobs() {
        assert_eq!(shares_of(Some("7"), None), [("7", 1.0)]);
        assert!(shares_of(None, None).is_empty());
        assert_eq!(
            shares_of(Some("a"), Some("a=0.75,b=0.25")),
            [("a", 0.75), ("b", 0.25)]
        );
        assert_eq!(shares_of(Some("a"), Some("a=0,b=1")), [("b", 1.0)]);
        assert_eq!(shares_of(Some("a"), Some("junk")), [("a", 1.0)]);
        assert_eq!(
            shares_of(Some("a"), Some("b=0.5,a=0.2,b=0.3")),
            [("a", 0.2), ("b", 0.5)]
        );
    }
}
