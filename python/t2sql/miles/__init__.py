"""What miles runs: the rollout adapter, the CISPO loss, the curriculum, and `t2sql-train`.

miles is handed dotted paths that stay stable (t2sql.sql_episode.generate, .reward_func,
.log_rollout, t2sql.cispo.cispo_loss, t2sql.curriculum.CurriculumDataSource, .record_rollout);
those top-level modules re-export from here.
"""
