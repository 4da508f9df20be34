//! The rmcp handler of flow's MCP server, and its two fronts: Streamable HTTP (mounted
//! at `/mcp` by `crate::serve`, behind the API's bearer tokens) and stdio (`flow mcp
//! serve`).
//!
//! Over HTTP the server is stateless (no MCP session to lose when a server restarts or
//! a load balancer picks another one): everything a call needs is in the ledger.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value as Json, json};
use tokio_util::sync::CancellationToken;

use super::call::{Call, Refused};
use super::{Front, KEY_META, STATUS_TOOL};

/// Who is calling, put in an HTTP request's extensions by the route that
/// authenticated it.
#[derive(Debug, Clone)]
pub struct Principal(pub String);

/// The handler: one per process, cloned per session.
#[derive(Debug, Clone)]
pub struct Handler {
    front: Arc<Front>,
    /// The caller of every request (stdio: the OS user); `None` over HTTP, where each
    /// request carries its [`Principal`].
    fixed: Option<String>,
}

/// The Streamable HTTP service `crate::serve` mounts at `/mcp`.
#[derive(Clone)]
pub struct Http(StreamableHttpService<Handler, LocalSessionManager>);

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Http(/mcp)")
    }
}

impl Http {
    /// Answers one HTTP request (whose extensions carry its [`Principal`]).
    pub async fn handle(&self, request: axum::extract::Request) -> axum::response::Response {
        let mut service = self.0.clone();
        match tower::Service::call(&mut service, request).await {
            Ok(response) => response.map(axum::body::Body::new),
            Err(never) => match never {},
        }
    }
}

impl Handler {
    /// The handler of an HTTP front (the caller comes with each request).
    pub fn http(front: Arc<Front>, stop: CancellationToken) -> Http {
        let handler = Handler { front, fixed: None };
        // Host and Origin are checked by the API's own guard in front of the route.
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_sse_keep_alive(None)
            .disable_allowed_hosts()
            .with_cancellation_token(stop);
        Http(StreamableHttpService::new(
            move || Ok(handler.clone()),
            Arc::default(),
            config,
        ))
    }

    /// Serves `front` on this process's stdin and stdout as `principal` until the
    /// client closes stdin or `stop` fires.
    pub async fn stdio(
        front: Arc<Front>,
        principal: String,
        stop: CancellationToken,
    ) -> Result<(), std::io::Error> {
        let handler = Handler {
            front,
            fixed: Some(principal),
        };
        let running = handler
            .serve_with_ct(rmcp::transport::stdio(), stop)
            .await
            .map_err(std::io::Error::other)?;
        running.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    }

    /// The caller of `context`'s request.
    fn principal(&self, context: &RequestContext<RoleServer>) -> Result<String, ErrorData> {
        if let Some(p) = &self.fixed {
            return Ok(p.clone());
        }
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Principal>())
            .map(|p| p.0.clone())
            .ok_or_else(|| ErrorData::internal_error("no authenticated caller", None))
    }

    /// The run a task id names (tasks are runs started over MCP).
    async fn task_run(&self, id: &str) -> Result<flow_ledger::Run, ErrorData> {
        let unknown = || ErrorData::invalid_params(format!("no task {id}"), None);
        if !id.starts_with("mcp_") {
            return Err(unknown());
        }
        match self.front.ledger.get_run(id).await {
            Ok(run) => Ok(run),
            Err(flow_ledger::Error::NotFound { .. }) => Err(unknown()),
            Err(e) => Err(ErrorData::internal_error(
                format!("the run could not be read: {e}"),
                None,
            )),
        }
    }

    /// Progress notifications for this call while it waits, when the client asked (a
    /// `progressToken`) and the workflow fans out (`for_each`).
    fn progress(
        &self,
        entry: &super::catalog::Entry,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        run_id: &str,
    ) -> Option<Progress> {
        let token = context
            .meta
            .get_progress_token()
            .or_else(|| request.meta.as_ref().and_then(|m| m.get_progress_token()))?;
        if !entry.workflow.nodes.iter().any(|n| n.for_each.is_some()) {
            return None;
        }
        let reporter = Reporter {
            front: self.front.clone(),
            peer: context.peer.clone(),
            token,
            run_id: run_id.to_owned(),
        };
        let looping = reporter.clone();
        let task = tokio::spawn(async move {
            let mut last = None;
            loop {
                tokio::time::sleep(PROGRESS_EVERY).await;
                last = looping.report(last).await;
            }
        });
        Some(Progress { reporter, task })
    }

    /// `flow_run_status`: the answer for a run, by id.
    async fn status(&self, arguments: Option<&rmcp::model::JsonObject>) -> CallToolResult {
        let id = arguments
            .and_then(|a| a.get("run_id"))
            .and_then(Json::as_str);
        let Some(id) = id else {
            return text_error("`run_id` (a string) is required".to_owned());
        };
        match self.front.ledger.get_run(id).await {
            Ok(run) => self.front.answer(&run, false).await,
            Err(flow_ledger::Error::NotFound { .. }) => text_error(format!("no run {id}")),
            Err(e) => text_error(format!("the run could not be read: {e}; try again")),
        }
    }
}

/// How often a waiting call's progress is read.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// Sends one call's progress notifications.
#[derive(Clone)]
struct Reporter {
    front: Arc<Front>,
    peer: rmcp::Peer<RoleServer>,
    token: rmcp::model::ProgressToken,
    run_id: String,
}

impl Reporter {
    /// Sends the items' progress if it moved since `last`; the progress now.
    async fn report(&self, last: Option<(usize, usize)>) -> Option<(usize, usize)> {
        let now = self.front.items_progress(&self.run_id).await;
        if let Some((done, total)) = now
            && now != last
        {
            let mut p =
                rmcp::model::ProgressNotificationParam::new(self.token.clone(), done as f64);
            p.total = Some(total as f64);
            p.message = Some(format!("{done} of {total} items done"));
            if let Err(e) = self.peer.notify_progress(p).await {
                tracing::debug!(error = %e, "MCP progress not delivered");
            }
        }
        now.or(last)
    }
}

/// A call's progress loop, and a last report when the wait ends.
struct Progress {
    reporter: Reporter,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Stops the loop and reports where the run got to (so a fast run still reports).
    async fn finish(self) {
        self.task.abort();
        self.reporter.report(None).await;
    }
}

/// A tool error with only a text.
fn text_error(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// The built-in status tool's definition.
fn status_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {"run_id": {"type": "string", "description": "The run id an earlier answer gave."}},
        "required": ["run_id"],
        "additionalProperties": false,
    });
    let schema = match schema {
        Json::Object(o) => o,
        _ => rmcp::model::JsonObject::new(),
    };
    Tool::new(
        STATUS_TOOL,
        "The state or result of a flow run an earlier call started: its output, or what it waits for.",
        Arc::new(schema),
    )
    .with_annotations(
        ToolAnnotations::with_title("flow run status")
            .read_only(true)
            .open_world(false),
    )
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("flow", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool runs a flow workflow. Its side effects happen at most once: send `_meta` \"io.flow/idempotency-key\" with a call to make a retry answer from the same run. An unknown outcome is never retried; approvals are decided by people, never by the caller.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools: Vec<Tool> = self
            .front
            .catalog
            .entries
            .iter()
            .map(|e| e.tool.clone())
            .collect();
        tools.push(status_tool());
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let run = self.task_run(&request.task_id).await?;
        Ok(GetTaskResult::new(self.front.detailed(&run).await))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let principal = self.principal(&context)?;
        self.task_run(&request.task_id).await?;
        match self.front.cancel(&request.task_id, &principal).await {
            // A run that finished first keeps its outcome: the cancel came too late.
            Ok(_) | Err(flow_ledger::Error::Conflict { .. }) => Ok(()),
            Err(e) => Err(ErrorData::internal_error(
                format!("the run could not be cancelled: {e}"),
                None,
            )),
        }
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        if name == STATUS_TOOL {
            return Some(status_tool());
        }
        self.front.catalog.get(name).map(|e| e.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == STATUS_TOOL {
            return Ok(self.status(request.arguments.as_ref()).await.into());
        }
        let Some(entry) = self.front.catalog.get(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("no tool `{}`", request.name),
                None,
            ));
        };
        let principal = self.principal(&context)?;
        let key = request
            .meta
            .as_ref()
            .and_then(|m| m.get(KEY_META))
            .or_else(|| context.meta.get(KEY_META))
            .and_then(Json::as_str)
            .map(str::to_owned);
        if key
            .as_deref()
            .is_some_and(|k| k.is_empty() || k.len() > 255)
        {
            return Ok(text_error(format!(
                "`_meta` \"{KEY_META}\" must be 1 to 255 characters"
            ))
            .into());
        }
        let call = Call {
            principal: &principal,
            tool: &request.name,
            arguments: request.arguments.clone().unwrap_or_default(),
            key: key.as_deref(),
        };
        let joined = match self.front.start(entry, &call).await {
            Ok(j) => j,
            Err(e @ (Refused::Arguments(_) | Refused::KeyReused { .. })) => {
                return Ok(text_error(e.to_string()).into());
            }
            Err(e @ Refused::Ledger(_)) => {
                tracing::warn!(tool = %request.name, error = %e, "MCP call not recorded");
                return Ok(text_error(e.to_string()).into());
            }
        };
        // Only a call without a key that found an earlier identical call "coalesced";
        // a keyed retry is the same call by the client's own word.
        let coalesced = !joined.created && key.is_none();
        let tasks = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        let progress = self.progress(entry, &request, &context, &joined.run.id);
        let settled = self.front.settle(joined.run, &context.ct).await;
        if let Some(progress) = progress {
            progress.finish().await;
        }
        match settled {
            Ok(run) => {
                let answer = self.front.answer(&run, coalesced).await;
                if tasks && !run.status.is_terminal() {
                    let task = CreateTaskResult::new(self.front.task(&run, &answer));
                    let task = match answer.meta {
                        Some(meta) => task.with_meta(meta),
                        None => task,
                    };
                    return Ok(CallToolResponse::Task(task));
                }
                Ok(answer.into())
            }
            Err(e) => Ok(text_error(format!(
                "the run was started but could not be read back: {e}; call `{STATUS_TOOL}` or this tool again with the same key"
            ))
            .into()),
        }
    }
}
