"""Recording: compile records, their running totals, the spans and events they become, and the live
console."""
