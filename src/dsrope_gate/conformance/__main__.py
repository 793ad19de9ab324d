from dsrope_gate.conformance.cli import main

raise SystemExit(main())
