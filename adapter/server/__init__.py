"""The container's HTTP server: settings, routes, body rules, admission, the calibrated policy applied
to each row, the decision log, process start and drain (SageMaker's contract on port 8080).

Imports the engine and the contract modules; nothing below imports it."""
