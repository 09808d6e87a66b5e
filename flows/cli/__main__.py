from trtflow.flows.cli import main

raise SystemExit(main())
