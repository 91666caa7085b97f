"""The month-long comparison of retraining policies (issue 20): tasks.timeline.plan (the script of the month and
the policies' rules, pure), tasks.timeline.run (the days, with the real components), tasks.timeline.report."""
