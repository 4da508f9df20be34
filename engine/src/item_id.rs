//! How an item of a `for_each` node is named, in one place: its step is `node[<key>]`
//! (retries `node[<key>]_retry<n>`) and its call `node[<key>]`. The executor builds these
//! names; the views, `flow show`, `--resolve`, reconciliation, redrive and fault
//! injection read them back. Node ids cannot hold `[`, so no item name is a node's.

/// The step id of an item's attempt: `node[<key>]`, then `node[<key>]_retry<n>`. The
/// first attempt's is also the item's call id.
pub fn item_step_id(node: &str, key: &str, retry: u32) -> String {
    if retry == 0 {
        format!("{node}[{key}]")
    } else {
        format!("{node}[{key}]_retry{retry}")
    }
}

/// The key of an item step of `node` at `retry` (`None`: not an item step of it).
pub fn item_key<'s>(node: &str, step_id: &'s str, retry: u32) -> Option<&'s str> {
    let rest = step_id.strip_prefix(node)?.strip_prefix('[')?;
    if retry == 0 {
        rest.strip_suffix(']')
    } else {
        rest.strip_suffix(&format!("]_retry{retry}"))
    }
}

/// Whether `id` (a step or call id) names an item of `node`.
pub fn is_item_of(node: &str, id: &str) -> bool {
    id.strip_prefix(node).is_some_and(|r| r.starts_with('['))
}

/// The node a call or step id belongs to: the id itself, or `node` for `node[<key>]…`.
pub fn node_of(id: &str) -> &str {
    id.split_once('[').map_or(id, |(node, _)| node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_names_round_trip_whatever_the_key_holds() {
        for key in ["a", "x]_retry1", "[", "42"] {
            for retry in [0, 1, 12] {
                let id = item_step_id("n", key, retry);
                assert_eq!(item_key("n", &id, retry), Some(key), "{id}");
                assert!(is_item_of("n", &id), "{id}");
                assert_eq!(node_of(&id), "n");
            }
        }
        assert_eq!(item_key("n", "n", 0), None);
        assert_eq!(item_key("n", "nn[a]", 0), None);
        assert!(!is_item_of("n", "n") && !is_item_of("n", "nn[a]"));
        assert_eq!(node_of("plain"), "plain");
    }
}
