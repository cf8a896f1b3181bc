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

/// `d1`, `d2` and `d` after a CTE `d0` (one row per GPU sample with its labelled `job_id`,
/// `job_shares`, and `secs`, `joules` of the whole GPU): `d` has one row per job and sample,
/// with `secs` and `joules` that job's share and `held` the sample's whole seconds, then
/// `filter` (" AND …") applied. A sample without shares is its job's whole; pairs that do not
/// parse are left out. The shares are taken as written: the server writes them normalised to
/// add up to 1 (`gpuwatch_store::schema::canonical_job_shares`).
pub(crate) fn split_sql(present: &[&str], filter: &str) -> String {
    let own = own_labels(present);
    let excluded: Vec<&str> = ["job_id", "secs", "joules"]
        .into_iter()
        .chain(own.iter().copied())
        .collect();
    let excluded = excluded.join(", ");
    let plain: String = own.iter().map(|c| format!(", {c}")).collect();
    let shared: String = own
        .iter()
        .map(|c| {
            if *c == "k8s_namespace" {
                format!(
                    ", CASE WHEN sj = job_id THEN {c} WHEN scheduler = 'kubernetes' THEN split_part(sj, '/', 1) END AS {c}"
                )
            } else {
                format!(", CASE WHEN sj = job_id THEN {c} END AS {c}")
            }
        })
        .collect();
    let positions: Vec<String> = (1..=gpuwatch_store::schema::MAX_JOB_SHARES)
        .map(|i| format!("({i})"))
        .collect();
    let positions = positions.join(", ");
    format!(
        r#"d1 AS (
  SELECT * EXCLUDE ({excluded}, job_shares), job_id, secs, joules, secs AS held{plain} FROM d0 WHERE job_shares IS NULL
), d2 AS (
  SELECT *, sh0 AS sh FROM (
    SELECT *, split_part(js, '=', 1) AS sj, TRY_CAST(split_part(js, '=', 2) AS DOUBLE) AS sh0
    FROM (SELECT d0.*, split_part(job_shares, ',', k.i) AS js FROM d0
          CROSS JOIN (VALUES {positions}) AS k(i) WHERE job_shares IS NOT NULL) x
  ) y WHERE sj <> '' AND sh0 >= 0 AND sh0 <= 1
), d AS (
  SELECT * FROM (
    SELECT * FROM d1
    UNION ALL
    SELECT * EXCLUDE ({excluded}, job_shares, js, sj, sh0, sh), sj AS job_id, secs * sh AS secs, joules * sh AS joules, secs AS held{shared}
    FROM d2 WHERE sh > 0
  ) z WHERE true{filter}
)"#
    )
}

/// Each job's share of a sample labelled with `job` and `shares` (its `job_shares`), as
/// [`split_sql`] takes them: `job` whole without shares, else the parsed shares above 0.
pub(crate) fn shares_of<'a>(job: Option<&'a str>, shares: Option<&'a str>) -> Vec<(&'a str, f64)> {
    let Some(text) = shares else {
        return job.map(|j| vec![(j, 1.0)]).unwrap_or_default();
    };
    parse_job_shares(text)
        .into_iter()
        .filter(|(_, s)| *s > 0.0)
        .collect()
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
        assert!(shares_of(Some("a"), Some("junk")).is_empty());
    }
}
