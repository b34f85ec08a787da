from bench.compare.cli import main

raise SystemExit(main())
