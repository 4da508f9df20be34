//! The for_each benchmark (being written).
fn main() {}
