//! flow-adapters
