SELECT host, gpu_uuid, job_id, job_user, max(gpu_utilization) AS max_utilization
FROM gpu_metrics
WHERE time > now() - INTERVAL '10 minutes' AND job_id IS NOT NULL
GROUP BY host, gpu_uuid, job_id, job_user
HAVING max(gpu_utilization) < 0.05
ORDER BY host, gpu_uuid
