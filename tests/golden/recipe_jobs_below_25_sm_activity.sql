SELECT job_id, job_user, count(DISTINCT gpu_uuid) AS gpus, round(avg(sm_active), 3) AS avg_sm_active
FROM gpu_metrics
WHERE time > now() - INTERVAL '24 hours' AND job_id IS NOT NULL AND sm_active IS NOT NULL
GROUP BY job_id, job_user
HAVING avg(sm_active) < 0.25
ORDER BY avg_sm_active
