WITH spans AS (
  SELECT job_user, job_id, host, gpu_uuid,
         (CAST(max(time) AS BIGINT) - CAST(min(time) AS BIGINT)) / 3.6e12 AS gpu_hours
  FROM gpu_metrics
  WHERE time >= date_trunc('week', now()) AND job_id IS NOT NULL
  GROUP BY job_user, job_id, host, gpu_uuid
)
SELECT job_user, round(sum(gpu_hours), 3) AS gpu_hours, count(DISTINCT job_id) AS jobs
FROM spans
GROUP BY job_user
ORDER BY gpu_hours DESC, job_user
