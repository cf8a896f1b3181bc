SELECT date_bin(INTERVAL '1 minute', time) AS time, host, avg(gpu_utilization) AS utilization
FROM gpu_metrics
WHERE time > now() - INTERVAL '1 hour'
GROUP BY 1, host
ORDER BY 1, host
