"""Change data capture into landing directories of Debezium JSON events."""
