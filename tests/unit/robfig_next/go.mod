// A tiny program for tests/unit/test_schedule_robfig.py: it asks robfig/cron v3.0.1,
// the library the Kubernetes CronJob controller schedules with, for fire times.
module guardedcron.io/tests/robfignext

go 1.22

require github.com/robfig/cron/v3 v3.0.1
