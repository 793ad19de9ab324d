from dsrope_gate.cli import main

raise SystemExit(main())
