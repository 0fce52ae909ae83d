"""The built-in environments: math, sheets, search, crm, harbor."""
