"""External evaluation of a run's checkpoints (``train.eval_command``), asynchronous, as VLN papers
report them: after each checkpoint save and at the end of the run, rank 0 starts a detached job
(:mod:`~janus_train.evals.job`) that exports the checkpoint for the evaluator and runs the user's
command; the command writes a JSON object of metrics; janus picks them up at its log steps, logs them
as ``eval/<NAME>`` on their own step axis and may keep the best evaluated checkpoint
(``train.best_metric: eval/SR``). :mod:`~janus_train.evals.command` fills the command line,
:mod:`~janus_train.evals.record` holds each evaluation's state on disk,
:mod:`~janus_train.evals.evaluations` launches, tracks and collects them."""
