"""GPU notebook jobs: a notebook run on a GPU as a job, holding the GPU only while it runs.

- :mod:`.store`: the table ``gpuhub_jobs`` in the hub database;
- :mod:`.checks`: what a new job must pass (the body, the profile, the notebook);
- :mod:`.lifecycle`: create, launch (a named server ``job-…`` started by the hub), stop,
  and the keeper (maximum run time, restarts);
- :mod:`.workload`: what a job's server runs, for the spawn lifecycle
  (:class:`hub_ext.spawn.workload.Workload`);
- :mod:`.hook`: the spawner hook: forged job starts refused, a job ended exactly once;
- :mod:`.handlers`: the REST endpoints (``/hub/api/gpuhub/jobs``), scope
  ``custom:gpuhub:jobs``;
- :mod:`.hubconfig`: the scope, the roles and server tokens that hold it, the hook.

In the job's container ``gpuhub-notebook-job`` (images/base) runs the notebook with
papermill.  The docs' "Run notebooks as GPU jobs" (howto/notebook-jobs) tells the story;
the endpoints are in reference/jobs-api.
"""
