//! An MCP test server (rmcp server side) whose tools count their calls.
//!
//! | tool | args | result | annotations |
//! |---|---|---|---|
//! | `echo` | any object | the args as `structuredContent` | — |
//! | `count` | `{key}` | `{key, count}`: calls so far with that key | — |
//! | `fail` | `{message?}` | `isError: true` with the message as text | — |
//! | `slow` | `{ms}` | `{slept_ms}` after sleeping; a `notifications/cancelled` for it ends the sleep and is counted ([`Stats::cancelled`], a `cancelled` count-file line) | — |
//! | `lookup` | `{id?}` | `{id, found: true}` | `readOnlyHint` |
//! | `set_flag` | `{name}` | `{name, set: true}` | `idempotentHint` |
//! | `delete_thing` | `{id}` | `{deleted: id}` | `destructiveHint` |
//! | `text` | `{text?}` | one plain text block (default `plain text`) | — |
//! | `json_text` | — | one text block holding `{"answer":42}` | — |
//! | `texts` | — | two text blocks: `one` and `{"two":2}` | — |
//! | `crash` | — | over stdio: the process exits(3) before answering; over HTTP: a JSON-RPC internal error | — |
//! | `protocol` | — | `{protocol_version}`: the version this request was served under | — |
//! | `task` | `{key, ms, fail?}` | counted under `key` when the call arrives (the effect), then answered with a task (`resultType: "task"`, poll interval 50 ms) that completes after `ms` with `{key, count, slept_ms}` — or fails with a JSON-RPC error when `fail` — when the client declared the tasks extension; else the same answer after the sleep, inline. Tasks outlive the session that started them (a new client may ask `tasks/get`); `tasks/get` requests are counted ([`Stats::task_gets`]) | — |
//! | `ask` | `{key}` | needs a name before it acts: without `inputResponses` it answers `input_required` (one elicitation `q`, message `flow testkit asks first`, schema as `elicit`'s default); with them it counts the call under `key` (the effect) and returns `{key, count, answer}` | — |
//! | `elicit` | `{schema?}` | asks the client (`elicitation/create`, message `flow testkit asks`) for `schema` (default: `name` string with default `ada`, required; `age` integer) and returns `{action, content}` from the answer | — |
//!
//! [`TestServer::pinned`] narrows the protocol versions the server accepts to one, to
//! test a client's negotiation against servers of each revision.
//!
//! Served over stdio by `flow-testkit mcp-stdio` ([`serve_stdio`]) and over streamable
//! HTTP by [`HttpServer`] (in-process, or `flow-testkit mcp-http`).

mod cross_app;
mod http;
mod oauth;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::InputResponses;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    ElicitRequestParams, GetTaskParams, GetTaskResult, InitializeRequestParams, InitializeResult,
    JsonObject, ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::model::{ElicitRequest, InputRequest, InputRequests, InputRequiredResult};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router,
};
use serde::Deserialize;
use serde_json::{Value, json};

pub use cross_app::CrossAppStats;
pub use http::{AuthOptions, HttpServer, HttpStats};
pub use oauth::AuthCodeStats;

/// What the tools saw: initializations, calls per tool, calls per `count` key.
#[derive(Debug, Default)]
pub struct Stats {
    initializes: AtomicU32,
    cancelled: AtomicU32,
    task_gets: AtomicU32,
    calls: Mutex<HashMap<String, u32>>,
    keys: Mutex<HashMap<String, u32>>,
}

impl Stats {
    /// Sessions initialized (one per client session).
    pub fn initializes(&self) -> u32 {
        self.initializes.load(Ordering::SeqCst)
    }

    /// Calls the client cancelled (`notifications/cancelled`) while they ran.
    pub fn cancelled(&self) -> u32 {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// `tasks/get` requests answered (any task, known or not).
    pub fn task_gets(&self) -> u32 {
        self.task_gets.load(Ordering::SeqCst)
    }

    /// Calls of `tool` that reached the tool.
    pub fn calls(&self, tool: &str) -> u32 {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(tool)
            .copied()
            .unwrap_or(0)
    }

    /// Calls of any tool that reached it.
    pub fn total_calls(&self) -> u32 {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }

    /// `count` calls with this key.
    pub fn count(&self, key: &str) -> u32 {
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// The server's handler. Cheap to clone; clones share [`Stats`].
#[derive(Debug, Clone)]
pub struct TestServer {
    tool_router: ToolRouter<Self>,
    stats: Arc<Stats>,
    count_file: Option<PathBuf>,
    /// Whether `crash` may exit the process (only when serving stdio in its own process).
    may_exit: bool,
    /// The only protocol version accepted, if pinned.
    pinned: Option<ProtocolVersion>,
    /// The tasks of every session (clones share them).
    tasks: Tasks,
}

/// The server's tasks, shared by every session of one server.
#[derive(Clone, Default)]
struct Tasks(TaskManager);

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tasks")
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct TaskArgs {
    /// The key the call's effect is counted under.
    key: String,
    /// How long the task works, in milliseconds.
    ms: u64,
    /// Whether the task ends in failure.
    fail: Option<bool>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct KeyArgs {
    /// The key calls are counted under.
    key: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct FailArgs {
    /// The error text.
    message: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct SlowArgs {
    /// How long to sleep, in milliseconds.
    ms: u64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct IdArgs {
    /// An id.
    id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ElicitArgs {
    /// The requested schema (an MCP elicitation schema object).
    schema: Option<Value>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct NameArgs {
    /// A name.
    name: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct TextArgs {
    /// The text to return.
    text: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct NoArgs {}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct BigArgs {
    /// How many bytes of text to answer with.
    bytes: usize,
}

impl TestServer {
    /// A server with fresh stats, logging calls to `count_file` if given.
    pub fn new(count_file: Option<PathBuf>) -> Self {
        Self::with_stats(Arc::new(Stats::default()), count_file, false)
    }

    fn with_stats(stats: Arc<Stats>, count_file: Option<PathBuf>, may_exit: bool) -> Self {
        TestServer {
            tool_router: Self::tool_router(),
            stats,
            count_file,
            may_exit,
            pinned: None,
            tasks: Tasks::default(),
        }
    }

    /// The same server accepting only protocol `version` (`initialize` or
    /// `server/discover`, whichever that revision has).
    pub fn pinned(mut self, version: Option<ProtocolVersion>) -> Self {
        self.pinned = version;
        self
    }

    /// The same server declaring `delete_thing` harmless (read-only, not destructive):
    /// a server that changed a tool's hints since a proxy pinned them.
    pub fn benign(mut self) -> Self {
        if let Some(route) = self.tool_router.map.get_mut("delete_thing") {
            route.attr.annotations = Some(
                rmcp::model::ToolAnnotations::new()
                    .read_only(true)
                    .destructive(false),
            );
        }
        self
    }

    /// The shared stats.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    fn note(&self, tool: &str, key: Option<&str>) -> u32 {
        *self
            .stats
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tool.to_string())
            .or_default() += 1;
        let count = match key {
            Some(key) => {
                let mut keys = self.stats.keys.lock().unwrap_or_else(|e| e.into_inner());
                let n = keys.entry(key.to_string()).or_default();
                *n += 1;
                *n
            }
            None => 0,
        };
        self.append(json!({"event": "call", "tool": tool, "key": key, "pid": std::process::id()}));
        count
    }

    fn append(&self, line: Value) {
        if let Some(path) = &self.count_file
            && let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}

#[tool_router]
impl TestServer {
    #[tool(description = "Returns its arguments as structured content.")]
    async fn echo(
        &self,
        Parameters(args): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("echo", None);
        Ok(CallToolResult::structured(Value::Object(args)))
    }

    #[tool(description = "Counts calls per key and returns the count.")]
    async fn count(
        &self,
        Parameters(args): Parameters<KeyArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let count = self.note("count", Some(&args.key));
        Ok(CallToolResult::structured(
            json!({"key": args.key, "count": count}),
        ))
    }

    #[tool(
        description = "How many times `count` was called with this key (reads only): what a reconciliation probe asks.",
        annotations(read_only_hint = true)
    )]
    async fn count_of(
        &self,
        Parameters(args): Parameters<KeyArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let count = self
            .stats
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&args.key)
            .copied()
            .unwrap_or(0);
        Ok(CallToolResult::structured(
            json!({"key": args.key, "count": count}),
        ))
    }

    #[tool(description = "Counts the call under `key`, then works `ms` milliseconds as a task.")]
    async fn task(
        &self,
        Parameters(args): Parameters<TaskArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let count = self.note("task", Some(&args.key));
        let answer = json!({"key": args.key, "count": count, "slept_ms": args.ms});
        let fail = args.fail.unwrap_or(false);
        let work = async move {
            tokio::time::sleep(Duration::from_millis(args.ms)).await;
            if fail {
                Err(TaskExit::Error(ErrorData::internal_error(
                    "the task failed",
                    None,
                )))
            } else {
                Ok(CallToolResult::structured(answer))
            }
        };
        let declared = context
            .peer
            .peer_info()
            .is_some_and(|info| info.capabilities.supports_tasks())
            || context
                .meta
                .client_capabilities()
                .is_some_and(|caps| caps.supports_tasks());
        if !declared {
            return match work.await {
                Ok(result) => Ok(result.into()),
                Err(_) => Err(ErrorData::internal_error("the task failed", None)),
            };
        }
        let options = TaskOptions::new().with_poll_interval_ms(50);
        let task = self.tasks.0.spawn(options, |_| Box::pin(work));
        self.append(json!({"event": "task", "task": task.task_id, "pid": std::process::id()}));
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    #[tool(description = "Always reports an error.")]
    async fn fail(
        &self,
        Parameters(args): Parameters<FailArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("fail", None);
        let message = args
            .message
            .unwrap_or_else(|| "the tool failed".to_string());
        Ok(CallToolResult::error(vec![ContentBlock::text(message)]))
    }

    #[tool(description = "Sleeps for `ms` milliseconds, or until the call is cancelled.")]
    async fn slow(
        &self,
        Parameters(args): Parameters<SlowArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("slow", None);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(args.ms)) => {
                Ok(CallToolResult::structured(json!({"slept_ms": args.ms})))
            }
            () = context.ct.cancelled() => {
                self.stats.cancelled.fetch_add(1, Ordering::SeqCst);
                self.append(json!({"event": "cancelled", "tool": "slow", "pid": std::process::id()}));
                Err(ErrorData::internal_error("cancelled", None))
            }
        }
    }

    #[tool(
        description = "Looks something up.",
        annotations(read_only_hint = true)
    )]
    async fn lookup(
        &self,
        Parameters(args): Parameters<IdArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("lookup", None);
        Ok(CallToolResult::structured(
            json!({"id": args.id, "found": true}),
        ))
    }

    #[tool(
        description = "Sets a flag; repeating it changes nothing.",
        annotations(idempotent_hint = true, read_only_hint = false)
    )]
    async fn set_flag(
        &self,
        Parameters(args): Parameters<NameArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("set_flag", None);
        Ok(CallToolResult::structured(
            json!({"name": args.name, "set": true}),
        ))
    }

    #[tool(
        description = "Deletes a thing.",
        annotations(destructive_hint = true, read_only_hint = false)
    )]
    async fn delete_thing(
        &self,
        Parameters(args): Parameters<IdArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("delete_thing", None);
        Ok(CallToolResult::structured(json!({"deleted": args.id})))
    }

    #[tool(description = "Returns plain text.")]
    async fn text(
        &self,
        Parameters(args): Parameters<TextArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("text", None);
        let text = args.text.unwrap_or_else(|| "plain text".to_string());
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    #[tool(description = "Answers with `bytes` bytes of text (an oversized answer).")]
    async fn big(
        &self,
        Parameters(args): Parameters<BigArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("big", None);
        Ok(CallToolResult::success(vec![ContentBlock::text(
            "x".repeat(args.bytes),
        )]))
    }

    #[tool(description = "Returns JSON as a text block.")]
    async fn json_text(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("json_text", None);
        Ok(CallToolResult::success(vec![ContentBlock::text(
            r#"{"answer":42}"#,
        )]))
    }

    #[tool(description = "Returns two text blocks.")]
    async fn texts(&self, Parameters(_): Parameters<NoArgs>) -> Result<CallToolResult, ErrorData> {
        self.note("texts", None);
        Ok(CallToolResult::success(vec![
            ContentBlock::text("one"),
            ContentBlock::text(r#"{"two":2}"#),
        ]))
    }

    #[tool(description = "Returns the protocol version this request was served under.")]
    async fn protocol(
        &self,
        Parameters(_): Parameters<NoArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("protocol", None);
        let version = context.protocol_version().map(|v| v.to_string());
        Ok(CallToolResult::structured(
            json!({"protocol_version": version}),
        ))
    }

    #[tool(description = "Asks the client for input and returns its answer.")]
    async fn elicit(
        &self,
        Parameters(args): Parameters<ElicitArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.note("elicit", None);
        let schema = args.schema.unwrap_or_else(|| {
            json!({"type": "object", "properties": {
                "name": {"type": "string", "default": "ada"},
                "age": {"type": "integer"}
            }, "required": ["name"]})
        });
        let requested_schema = serde_json::from_value(schema)
            .map_err(|e| ErrorData::invalid_params(format!("bad schema: {e}"), None))?;
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: "flow testkit asks".to_string(),
            requested_schema,
        };
        let answer = context
            .peer
            .create_elicitation(params)
            .await
            .map_err(|e| ErrorData::internal_error(format!("elicitation failed: {e}"), None))?;
        Ok(CallToolResult::structured(
            json!({"action": answer.action, "content": answer.content}),
        ))
    }

    #[tool(description = "Asks for a name through an input_required result before it acts.")]
    async fn ask(
        &self,
        InputResponses(responses): InputResponses,
        Parameters(args): Parameters<KeyArgs>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(answer) = responses.and_then(|mut r| r.remove("q")) {
            let count = self.note("ask", Some(&args.key));
            let result = json!({"key": args.key, "count": count, "answer": answer});
            return Ok(CallToolResult::structured(result).into());
        }
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "ada"},
            "age": {"type": "integer"}
        }, "required": ["name"]});
        let requested_schema = serde_json::from_value(schema)
            .map_err(|e| ErrorData::internal_error(format!("bad schema: {e}"), None))?;
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: "flow testkit asks first".to_string(),
            requested_schema,
        };
        let mut asked = InputRequests::new();
        asked.insert(
            "q".to_string(),
            InputRequest::Elicitation(ElicitRequest::new(params)),
        );
        Ok(CallToolResponse::InputRequired(
            InputRequiredResult::from_input_requests(asked),
        ))
    }

    #[tool(description = "Exits the server process before answering (stdio only).")]
    async fn crash(&self, Parameters(_): Parameters<NoArgs>) -> Result<CallToolResult, ErrorData> {
        self.note("crash", None);
        if self.may_exit {
            std::process::exit(3);
        }
        Err(ErrorData::internal_error(
            "crash is only fatal over stdio",
            None,
        ))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        let mut info = ServerConfig::new(capabilities)
            .with_instructions("flow's MCP test server: tools that count their calls");
        if let Some(version) = &self.pinned {
            info.protocol_version = version.clone();
        }
        info
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        match &self.pinned {
            Some(version) => std::borrow::Cow::Owned(vec![version.clone()]),
            None => std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.stats.task_gets.fetch_add(1, Ordering::SeqCst);
        self.tasks
            .0
            .get_task(&request.task_id)
            .map(GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.0.cancel_task(&request.task_id)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.stats.initializes.fetch_add(1, Ordering::SeqCst);
        self.append(json!({"event": "initialize", "pid": std::process::id()}));
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }
}

/// Serves the test server on this process's stdin/stdout until the client disconnects
/// (`flow-testkit mcp-stdio`). `crash` exits the process; `benign` see
/// [`TestServer::benign`].
pub async fn serve_stdio(
    count_file: Option<PathBuf>,
    protocol: Option<ProtocolVersion>,
    benign: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut server =
        TestServer::with_stats(Arc::new(Stats::default()), count_file, true).pinned(protocol);
    if benign {
        server = server.benign();
    }
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// Reads a `--count-file`: one JSON value per line.
pub fn read_count_file(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}
