SELECT host, gpu_uuid,
       increase(energy_joules, time) AS energy_joules,
       round(rate(energy_joules, time), 3) AS watts,
       increase(xid_errors_total, time) AS xids,
       count(*) AS samples
FROM gpu_metrics
GROUP BY host, gpu_uuid
ORDER BY host, gpu_uuid
