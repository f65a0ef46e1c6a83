"""`python -m awm_grpo.warmstart`: see awm_grpo/warmstart/sft.py."""

from awm_grpo.warmstart.sft import main

raise SystemExit(main())
