//! Placeholder for the test kit (KIT builds the real crate); lets the workspace load alone.
