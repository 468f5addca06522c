from guardedcron.cli.main import main

raise SystemExit(main())
