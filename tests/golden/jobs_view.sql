SELECT job_id, scheduler, job_user, job_name, host, gpus, first_seen, last_seen,
       gpu_seconds, idle_gpu_seconds, energy_joules
FROM jobs
ORDER BY job_id, host
