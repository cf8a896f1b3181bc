WITH per_gpu AS (
  SELECT job_id, job_user, host, gpu_uuid, increase(energy_joules, time) AS joules
  FROM gpu_metrics
  WHERE time > now() - INTERVAL '7 days' AND job_id IS NOT NULL
  GROUP BY job_id, job_user, host, gpu_uuid
)
SELECT job_id, job_user, round(sum(joules), 1) AS joules, round(sum(joules) / 3.6e6, 6) AS kwh
FROM per_gpu
GROUP BY job_id, job_user
ORDER BY joules DESC
