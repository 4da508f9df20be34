//! In-process functions: async Rust code registered by name.
//!
//! A workflow names a function (`kind: function, function: core.echo`); the engine
//! looks it up in a [`Registry`] and calls it with the node's rendered `with`. Embedders
//! register their own functions next to the built-ins:
//!
//! ```
//! use flow_adapters::function::{FunctionSpec, Registry};
//! use flow_adapters::Error;
//! use serde_json::{json, Value};
//!
//! async fn greet(args: Value) -> Result<Value, Error> {
//!     let name = args["name"]
//!         .as_str()
//!         .ok_or_else(|| Error::permanent("greet: `name` must be a string"))?;
//!     Ok(json!({ "greeting": format!("hello, {name}") }))
//! }
//!
//! let registry = Registry::with_builtins();
//! registry.register("acme.greet", FunctionSpec::pure("Greets someone."), greet)?;
//! assert!(registry.is_pure("acme.greet"));
//! # Ok::<(), flow_adapters::function::RegisterError>(())
//! ```
//!
//! A function returns its own classified [`Error`]; the adapter adds only the
//! timeout (`Call::timeout`) and panic handling:
//!
//! - pure function timed out → `Transient` ("timed out"); panicked → `Permanent`;
//! - impure function (it may have acted) timed out or panicked → `Unknown`.
//!
//! `requests_sent` is 0 for pure functions (nothing leaves the process, no outbound
//! mark is needed) and 1 for impure ones (their effect is what usage counts).
//!
//! # Built-ins (all pure)
//!
//! Every built-in rejects unknown argument keys with a `Permanent` error naming them.
//!
//! | name | args | output |
//! |---|---|---|
//! | `core.echo` | anything | the args unchanged |
//! | `core.sleep` | `{duration: "250ms"}` or `{ms: 250}` | `{slept_ms: 250}`; longer than the call timeout → `Transient` "timed out" |
//! | `core.fail` | `{message?, kind?: permanent\|transient\|unknown\|not_sent, retry_after_ms?}` | always fails with that kind (default `permanent`, message "core.fail") — for exercising retries |
//! | `core.merge` | `{objects: [{..}, {..}]}`, or any object of objects | shallow merge, later keys win (without `objects`: the arg values in key order) |
//! | `core.template`, `core.format` | `{text: "..."}` | the text (the engine already rendered its `${{ }}`) |
//! | `core.sum` | `{values: [1, 2.5]}` | the sum (an integer when every value is one) |
//! | `core.pick` | `{object: {..}, keys: ["a", "b"]}` | the object with only those keys (missing keys skipped) |
//! | `core.get` | `{value: any, path: "a.b.0"}` | the value at that dotted path, `null` when absent |
//! | `core.json_parse` | `{text: "{\"a\":1}"}` | the parsed JSON (invalid JSON → `Permanent`) |

mod builtins;

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};

use futures::FutureExt;
use serde_json::Value;

use crate::{BoxFuture, Call, Error, Outcome, SideEffect, Tool};

/// A registered function: takes the rendered `with`, returns the output or a
/// classified error.
pub type Function = Arc<dyn Fn(Value) -> BoxFuture<'static, Result<Value, Error>> + Send + Sync>;

/// What the engine needs to know about a function besides its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    /// No side effects: the engine skips the outbound mark, and a re-run is harmless.
    pub pure: bool,
    /// One line for `--help`-style listings.
    pub description: String,
}

impl FunctionSpec {
    /// A function without side effects.
    pub fn pure(description: impl Into<String>) -> Self {
        FunctionSpec {
            pure: true,
            description: description.into(),
        }
    }

    /// A function with side effects (it sends mail, writes files…): treated like any
    /// outbound call by the engine.
    pub fn effectful(description: impl Into<String>) -> Self {
        FunctionSpec {
            pure: false,
            description: description.into(),
        }
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The name is taken (built-ins included); replacing silently would change what
    /// existing workflows do.
    #[error("function `{0}` is already registered")]
    Duplicate(String),
    /// Names are non-empty and made of `[A-Za-z0-9_.-]`, so they read well in YAML.
    #[error("invalid function name `{0}`: use letters, digits, `_`, `-` and `.`")]
    InvalidName(String),
}

#[derive(Clone)]
struct Entry {
    spec: FunctionSpec,
    function: Function,
}

/// The functions a process can call by name. Cheap to clone (shared inside).
#[derive(Clone, Default)]
pub struct Registry {
    entries: Arc<RwLock<BTreeMap<String, Entry>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("names", &self.names())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry holding the `core.*` built-ins (see the module docs).
    pub fn with_builtins() -> Self {
        let registry = Self::new();
        builtins::register_all(&registry);
        registry
    }

    /// Registers `function` under `name`. Any `async fn(Value) -> Result<Value, Error>`
    /// or closure returning such a future works.
    pub fn register<F, Fut>(
        &self,
        name: impl Into<String>,
        spec: FunctionSpec,
        function: F,
    ) -> Result<(), RegisterError>
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, Error>> + Send + 'static,
    {
        let name = name.into();
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            return Err(RegisterError::InvalidName(name));
        }
        let function: Function = Arc::new(move |args| Box::pin(function(args)));
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if entries.contains_key(&name) {
            return Err(RegisterError::Duplicate(name));
        }
        entries.insert(name, Entry { spec, function });
        Ok(())
    }

    /// The tool for `name`, or `None` when no such function is registered (the engine
    /// reports that as a validation error before anything runs).
    pub fn get(&self, name: &str) -> Option<FunctionTool> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.get(name).map(|entry| FunctionTool {
            name: name.to_string(),
            spec: entry.spec.clone(),
            function: entry.function.clone(),
        })
    }

    /// Whether `name` is registered and pure.
    pub fn is_pure(&self, name: &str) -> bool {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.get(name).is_some_and(|entry| entry.spec.pure)
    }

    /// The spec of `name`, if registered.
    pub fn spec(&self, name: &str) -> Option<FunctionSpec> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.get(name).map(|entry| entry.spec.clone())
    }

    /// All registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.keys().cloned().collect()
    }
}

/// A registered function ready to be called as a [`Tool`].
#[derive(Clone)]
pub struct FunctionTool {
    name: String,
    spec: FunctionSpec,
    function: Function,
}

impl std::fmt::Debug for FunctionTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionTool")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .finish()
    }
}

impl FunctionTool {
    /// The registered name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the function is pure.
    pub fn is_pure(&self) -> bool {
        self.spec.pure
    }

    async fn run(&self, call: Call) -> Outcome {
        if let Err(why) = call.fence.check() {
            let what = format!("function `{}`", self.name);
            return Outcome::err(Error::fenced(why, &what, 0), 0);
        }
        let sent = if self.spec.pure { 0 } else { 1 };
        let future = AssertUnwindSafe((self.function)(call.args)).catch_unwind();
        let result = match tokio::time::timeout(call.timeout, future).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_string());
                let message = format!("function `{}` panicked: {what}", self.name);
                Err(if self.spec.pure {
                    Error::permanent(message)
                } else {
                    Error::unknown(message)
                })
            }
            Err(_) => {
                let message = format!(
                    "function `{}` timed out after {}ms",
                    self.name,
                    call.timeout.as_millis()
                );
                Err(if self.spec.pure {
                    Error::transient(message, None)
                } else {
                    Error::unknown(message)
                })
            }
        };
        Outcome {
            result,
            requests_sent: sent,
            task: None,
            mcp_session: None,
            http_status: None,
        }
    }
}

impl Tool for FunctionTool {
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(self.run(call))
    }

    fn side_effect(&self) -> SideEffect {
        if self.spec.pure {
            SideEffect::ReadOnly
        } else {
            SideEffect::NotIdempotent
        }
    }
}
