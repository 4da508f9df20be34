//! flow-ledger
