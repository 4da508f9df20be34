//! The OpenAPI 3.1 document of the API, generated from the list of [`Operation`]s
//! (`api::OPERATIONS`, the one list the router is built from) and the request and response types' schemas
//! (`schemars`, JSON Schema 2020-12 as OpenAPI 3.1 takes it), served at
//! `/api/v1/openapi.json`. `docs/openapi.json` is the committed copy; a test fails when
//! it differs from what the server serves, and another generates a client from it.

use std::sync::Arc;

use axum::routing::MethodRouter;
use schemars::generate::{Contract, SchemaSettings};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value as Json, json};

use super::App;
use crate::role::Role;

/// An HTTP method the API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Reads.
    Get,
    /// Changes.
    Post,
}

impl Method {
    /// As OpenAPI spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
        }
    }
}

/// A type's schema, as the OpenAPI document refers to it.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// One answer an operation gives on success.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// When it is given.
    pub description: &'static str,
    /// Its body's type.
    pub body: Option<SchemaFn>,
    /// Its media type.
    pub media: &'static str,
}

/// An answer with a JSON body of type `body`.
pub const fn json(status: u16, description: &'static str, body: SchemaFn) -> Answer {
    Answer {
        status,
        description,
        body: Some(body),
        media: "application/json",
    }
}

/// One operation of the API: where it is, who may call it, its handler, and the types
/// of what it takes and answers.
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    /// The `operationId` (what a generated client names the method).
    pub id: &'static str,
    /// `GET` or `POST`.
    pub method: Method,
    /// The path, parameters in braces.
    pub path: &'static str,
    /// The least role allowed (`None`: no token needed). The handler's `Authed<Role>`
    /// extractor enforces it; a test checks the two agree.
    pub role: Option<Role>,
    /// What it does.
    pub summary: &'static str,
    /// Its handler, as a method router for its path.
    pub handler: fn() -> MethodRouter<Arc<App>>,
    /// The type of its query string.
    pub query: Option<SchemaFn>,
    /// The type of its body.
    pub body: Option<SchemaFn>,
    /// Whether the body must be sent (cancel and resume take an optional one).
    pub body_required: bool,
    /// Its answers on success.
    pub answers: &'static [Answer],
    /// The error statuses it documents (each an `application/problem+json` body).
    pub problems: &'static [u16],
}

/// What the document's schemas are generated with: definitions under
/// `#/components/schemas`, no `$schema` member (OpenAPI 3.1's dialect is 2020-12).
/// Requests are described as the server reads them (a field with a default may be
/// left out), answers as it writes them (every field is there, `null` or not).
fn generator(contract: Contract) -> SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    settings.contract = contract;
    SchemaGenerator::new(settings)
}

/// The two generators of one document: requests, answers.
struct Generators {
    /// For queries and request bodies.
    read: SchemaGenerator,
    /// For answers.
    written: SchemaGenerator,
}

/// The schema of `T` as an operation refers to it (a `$ref` for named types).
pub fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// The statuses an operation may answer besides its success, and why.
fn problem_text(status: u16) -> &'static str {
    match status {
        400 => {
            "Malformed JSON, unknown field or wrong type (detail names the field); a control character (NUL…) in the path or query; a run id outside the id grammar"
        }
        401 => "No valid bearer token",
        403 => "The token's role is too low",
        404 => "No such run, call or route",
        409 => "Conflicts with the current state (detail says which)",
        413 => "Body over 16 MiB",
        422 => "The workflow does not validate (errors lists every diagnostic)",
        429 => "Too many failed authentications from this address (Retry-After says when to retry)",
        502 => {
            "A server flow had to ask (an MCP or authorization server) failed (detail says which)"
        }
        503 => "The database cannot be used now",
        _ => "Error",
    }
}

/// The query parameters of `op`: one per property of its query type (integers stay
/// integers, enums stay enums), and `id` / `node` / `schedule` / `name` / `token` for a
/// path with `{id}` / `{node}` / `{schedule}` / `{name}` / `{token}`.
fn parameters(op: &Operation, g: &mut SchemaGenerator) -> Vec<Json> {
    let mut params = Vec::new();
    if op.path.contains("{id}") {
        params.push(json!({"name": "id", "in": "path", "required": true, "description": "The run id", "schema": {"type": "string"}}));
    }
    if op.path.contains("{node}") {
        params.push(json!({"name": "node", "in": "path", "required": true, "description": "The node id", "schema": {"type": "string"}}));
    }
    if op.path.contains("{schedule}") {
        params.push(json!({"name": "schedule", "in": "path", "required": true, "description": "The schedule id (`[[schedules]] id` of the server's flow.toml)", "schema": {"type": "string"}}));
    }
    if op.path.contains("{name}") {
        params.push(json!({"name": "name", "in": "path", "required": true, "description": "The connection (`[[connections]] name` of the server's flow.toml)", "schema": {"type": "string"}}));
    }
    if op.path.contains("{token}") {
        params.push(json!({"name": "token", "in": "path", "required": true, "description": "The callback token (from `callback.url`)", "schema": {"type": "string"}}));
    }
    let Some(query) = op.query else {
        return params;
    };
    let schema = inline(query(g), g);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = schema.get("properties").and_then(Json::as_object) {
        for (name, prop) in props {
            let mut prop = prop.clone();
            let description = prop
                .as_object_mut()
                .and_then(|p| p.remove("description"))
                .unwrap_or(Json::Null);
            params.push(json!({
                "name": name,
                "in": "query",
                "required": required.contains(&name.as_str()),
                "description": description,
                "schema": not_null(prop),
            }));
        }
    }
    params
}

/// `schema` with a `$ref` to a component resolved (a query type's properties are
/// listed one by one as parameters).
fn inline(schema: Schema, g: &SchemaGenerator) -> Json {
    let v = schema.to_value();
    let Some(name) = v
        .get("$ref")
        .and_then(Json::as_str)
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
    else {
        return v;
    };
    g.definitions().get(name).cloned().unwrap_or(v)
}

/// A query parameter's schema without its `null` alternative (an absent parameter is
/// how a query says "none").
fn not_null(mut prop: Json) -> Json {
    if let Some(types) = prop.get_mut("type").and_then(Json::as_array_mut) {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types[0].clone();
            prop["type"] = only;
        }
    }
    if let Some(any) = prop.get("anyOf").and_then(Json::as_array) {
        let rest: Vec<Json> = any
            .iter()
            .filter(|s| s.get("type") != Some(&json!("null")))
            .cloned()
            .collect();
        if rest.len() == 1 {
            return rest[0].clone();
        }
    }
    prop
}

/// The operation object of `op`.
fn operation(op: &Operation, g: &mut Generators) -> Json {
    let mut responses = Map::new();
    for answer in op.answers {
        let mut r = json!({"description": answer.description});
        if let Some(body) = answer.body {
            r["content"] = json!({ answer.media: {"schema": body(&mut g.written).to_value()} });
        }
        responses.insert(answer.status.to_string(), r);
    }
    for status in op.problems {
        responses.insert(
            status.to_string(),
            json!({
                "description": problem_text(*status),
                "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
            }),
        );
    }
    let mut o = json!({
        "operationId": op.id,
        "summary": op.summary,
        "parameters": parameters(op, &mut g.read),
        "responses": responses,
        "security": if op.role.is_some() { json!([{"bearer": []}]) } else { json!([]) },
    });
    if let Some(role) = op.role {
        o["x-flow-role"] = json!(role.as_str());
        o["description"] = json!(format!("Needs the `{}` role (or higher).", role.as_str()));
    }
    if let Some(body) = op.body {
        o["requestBody"] = json!({
            "required": op.body_required,
            "content": {"application/json": {"schema": body(&mut g.read).to_value()}},
        });
    }
    o
}

/// The document of `operations`.
pub fn document(operations: &[Operation]) -> Json {
    let mut g = Generators {
        read: generator(Contract::Deserialize),
        written: generator(Contract::Serialize),
    };
    let mut paths = Map::new();
    for op in operations {
        let o = operation(op, &mut g);
        let entry = paths
            .entry(op.path.to_string())
            .or_insert_with(|| json!({}));
        entry[op.method.as_str()] = o;
    }
    let _ = g.written.subschema_for::<super::problem::ProblemBody>();
    // One set of components: a type both read and written (the status enums) has
    // one schema either way.
    let mut schemas: Map<String, Json> = g.written.take_definitions(true).into_iter().collect();
    for (name, schema) in g.read.take_definitions(true) {
        schemas.entry(name).or_insert(schema);
    }
    for s in schemas.values_mut() {
        any_value_as_object(s);
        plain_enum(s);
    }
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {"title": "flow operator API", "version": env!("CARGO_PKG_VERSION"), "description": "Runs, calls in doubt and their resolution. Roles: viewer reads; operator also submits, cancels, resumes, resolves; admin also bulk operations."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
    });
    any_value_as_object(&mut doc["paths"]);
    doc
}

/// Replaces the schema `true` ("any JSON value", what `serde_json::Value` derives) with
/// the equivalent `{}`: some client generators read only object schemas.
fn any_value_as_object(v: &mut Json) {
    match v {
        Json::Object(map) => {
            for (key, child) in map.iter_mut() {
                let schema_slot =
                    matches!(key.as_str(), "items" | "schema" | "additionalProperties");
                if child == &Json::Bool(true) && schema_slot {
                    *child = json!({});
                } else if key == "properties" {
                    if let Json::Object(props) = child {
                        for p in props.values_mut() {
                            if p == &Json::Bool(true) {
                                *p = json!({});
                            } else {
                                any_value_as_object(p);
                            }
                        }
                    }
                } else {
                    any_value_as_object(child);
                }
            }
        }
        Json::Array(items) => items.iter_mut().for_each(any_value_as_object),
        _ => {}
    }
}

/// A string enum whose variants carry docs is derived as `oneOf` of `const`s; clients
/// model `enum` better (one type, not a union of literals tried in turn), so it
/// becomes `{"type": "string", "enum": [...]}` with each variant's doc in the
/// description.
fn plain_enum(schema: &mut Json) {
    let Some(variants) = schema.get("oneOf").and_then(Json::as_array) else {
        return;
    };
    let mut values = Vec::new();
    let mut docs = Vec::new();
    for v in variants {
        let Some(value) = v.get("const").and_then(Json::as_str) else {
            return;
        };
        if let Some(doc) = v.get("description").and_then(Json::as_str) {
            docs.push(format!("- `{value}`: {}", doc.replace('\n', " ")));
        }
        values.push(json!(value));
    }
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    obj.remove("oneOf");
    let about = obj
        .get("description")
        .and_then(Json::as_str)
        .map(str::to_string)
        .unwrap_or_default();
    let description = [about, docs.join("\n")]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    obj.insert("type".into(), json!("string"));
    obj.insert("enum".into(), Json::Array(values));
    obj.insert("description".into(), json!(description));
}

/// The document of `operations` as served and committed: pretty JSON with a final
/// newline.
pub fn text(operations: &[Operation]) -> String {
    let mut t = serde_json::to_string_pretty(&document(operations)).unwrap_or_default();
    t.push('\n');
    t
}
