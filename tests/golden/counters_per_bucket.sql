SELECT date_bin(INTERVAL '10 minutes', time) AS bucket, gpu_uuid,
       increase(energy_joules, time) AS energy_joules,
       rate(energy_joules, time) AS watts
FROM gpu_metrics
WHERE host = 'node-1'
GROUP BY 1, gpu_uuid
ORDER BY 1, gpu_uuid
