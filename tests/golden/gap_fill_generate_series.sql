WITH buckets AS (
  SELECT value AS bucket
  FROM generate_series(TIMESTAMP '2026-01-05T00:30:00Z', TIMESTAMP '2026-01-05T00:55:00Z', INTERVAL '5 minutes')
),
samples AS (
  SELECT date_bin(INTERVAL '5 minutes', time) AS bucket, avg(gpu_utilization) AS utilization,
         count(*) AS samples
  FROM gpu_metrics
  WHERE gpu_uuid = 'GPU-c'
  GROUP BY 1
)
SELECT b.bucket, s.utilization, coalesce(s.samples, 0) AS samples,
       last_value(s.utilization) IGNORE NULLS OVER (ORDER BY b.bucket) AS carried_forward
FROM buckets b LEFT JOIN samples s ON s.bucket = b.bucket
ORDER BY b.bucket
