"""`python -m awm_grpo.launch` (what run_awm_grpo.sh runs): see awm_grpo/launch/job.py."""

from awm_grpo.launch.job import main

raise SystemExit(main())
