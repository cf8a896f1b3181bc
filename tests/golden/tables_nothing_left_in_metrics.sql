SELECT metric, count(*) AS points
FROM metrics
GROUP BY metric
ORDER BY metric
