"""The spreadsheet environment: SpreadsheetBench-style tasks, a sandboxed code runner, recalculated formulas."""
