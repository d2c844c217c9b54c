"""AWS Batch's node wiring: children register with the main node (bounded, authenticated by
HMAC), which answers with the node table and the go."""
