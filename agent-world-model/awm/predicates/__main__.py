"""`python -m awm.predicates`: see awm/predicates/build.py."""

from awm.predicates.build import main

raise SystemExit(main())
