WITH buckets AS (
  SELECT value AS time
  FROM generate_series(date_bin(INTERVAL '5 minutes', now() - INTERVAL '25 minutes'),
                       date_bin(INTERVAL '5 minutes', now()),
                       INTERVAL '5 minutes')
), power AS (
  SELECT date_bin(INTERVAL '5 minutes', time) AS time, host, gpu_uuid,
         rate(energy_joules, time) AS watts
  FROM gpu_metrics
  WHERE time > now() - INTERVAL '35 minutes'
  GROUP BY 1, host, gpu_uuid
), gpus AS (
  SELECT DISTINCT host, gpu_uuid FROM power
)
SELECT b.time, g.host, g.gpu_uuid, round(p.watts, 1) AS watts
FROM buckets b CROSS JOIN gpus g
LEFT JOIN power p ON p.time = b.time AND p.host = g.host AND p.gpu_uuid = g.gpu_uuid
ORDER BY g.host, g.gpu_uuid, b.time
