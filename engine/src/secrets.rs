//! Secrets: where their values come from, and how they are kept off disk and out of logs.
//!
//! Values come from the environment (`FLOW_SECRET_<NAME>`) or a dotenv file
//! (`--secrets-file`); the environment wins. The ledger stores `{"$secret": "NAME"}` in
//! place of a value ([`REDACTED_KEY`]), and every output, error message and log line that
//! leaves the gateway goes through [`Secrets::scrub`] first, so a downstream that echoes a
//! token back cannot smuggle it into the database.
//!
//! A downstream rarely echoes a value as it was sent: a JSON body holds it JSON-escaped, an
//! error page HTML-escaped, a URL percent-encoded, a log line escaped once more. So the
//! scrubber looks for every such *form* of every secret ([`forms`]), all at once: one
//! Aho-Corasick automaton, built when the set of secrets is built, finds them in a single
//! pass (leftmost-longest, so the longest form at a place wins). Each form is replaced by
//! the stand-in written in the same escaping (a JSON-escaped secret by a JSON-escaped
//! stand-in), so a scrubbed JSON text stays JSON.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use serde_json::Value as Json;

/// Prefix of the environment variables that provide secrets.
pub const ENV_PREFIX: &str = "FLOW_SECRET_";
/// The key of the object that stands in for a secret value in stored requests.
pub const REDACTED_KEY: &str = "$secret";

/// Why secrets could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The secrets file could not be read or parsed.
    #[error("cannot read secrets file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong (never a value).
        reason: String,
    },
    /// Values shorter than [`MIN_SECRET_BYTES`]: too short to scrub (exit 2). Names
    /// only, never values.
    #[error(
        "{} shorter than {min} bytes: too short to scrub from logs and stored output without also replacing unrelated text; use a longer value",
        names.iter().map(|n| format!("secret `{n}` is")).collect::<Vec<_>>().join(", ")
    )]
    TooShort {
        /// The secrets whose values are too short, sorted.
        names: Vec<String>,
        /// [`MIN_SECRET_BYTES`].
        min: usize,
    },
    /// The secrets file is over [`crate::read_limited::MAX_FILE_BYTES`] (1 MiB); reading
    /// stopped there (`--secrets-file /dev/zero` is refused at once; exit 2).
    #[error("secrets file {path} is larger than the limit of {limit} bytes (1 MiB)")]
    TooLarge {
        /// The file.
        path: String,
        /// The limit in bytes.
        limit: u64,
    },
}

/// The secret values available to a process. `Debug` shows names only.
///
/// Cloning is cheap (the scrubber is shared): the log writer clones it per line.
#[derive(Clone, Default)]
pub struct Secrets {
    values: BTreeMap<String, String>,
    /// Every form of every value, compiled once; `None` when there is nothing to find.
    scrubber: Option<Arc<Scrubber>>,
}

/// The compiled forms of a set of secrets and what replaces each.
struct Scrubber {
    /// Finds every form in one pass; `None` only if the automaton could not be built,
    /// then the forms are replaced one by one (slower, never less thorough).
    automaton: Option<AhoCorasick>,
    /// The forms, in the automaton's pattern order.
    patterns: Vec<String>,
    /// The stand-in for each pattern, in the same escaping as the pattern.
    replacements: Vec<String>,
}

impl Scrubber {
    fn new(values: &BTreeMap<String, String>) -> Option<Self> {
        let mut seen = HashSet::new();
        let mut patterns = Vec::new();
        let mut replacements = Vec::new();
        // Longer values first: where one value holds another, the longer one's forms
        // come first among equal-length matches (and leftmost-longest does the rest).
        let mut pairs: Vec<(&String, &String)> =
            values.iter().filter(|(_, v)| !v.is_empty()).collect();
        pairs.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        for (name, value) in pairs {
            for (form, replacement) in forms(value, &placeholder_text(name)) {
                if !form.is_empty() && seen.insert(form.clone()) {
                    patterns.push(form);
                    replacements.push(replacement);
                }
            }
        }
        if patterns.is_empty() {
            return None;
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok();
        Some(Self {
            automaton,
            patterns,
            replacements,
        })
    }

    fn scrub(&self, text: &[u8]) -> Vec<u8> {
        let out = self.scrub_whole(text);
        self.scrub_cut_tail(out)
    }

    /// A text cut short and marked with `…` (the adapters quote at most the first bytes
    /// of an error body) may end in the first part of a secret: that part, at least
    /// [`MIN_CUT_PREFIX`] bytes of any form, is replaced too.
    fn scrub_cut_tail(&self, mut out: Vec<u8>) -> Vec<u8> {
        const ELLIPSIS: &[u8] = "…".as_bytes();
        const REPLACEMENT_CHAR: &[u8] = "\u{fffd}".as_bytes();
        let Some(body) = out.strip_suffix(ELLIPSIS) else {
            return out;
        };
        // A cut inside a multi-byte character leaves U+FFFD after the prefix.
        let body = body.strip_suffix(REPLACEMENT_CHAR).unwrap_or(body);
        let mut best: Option<(usize, usize)> = None;
        for (i, pattern) in self.patterns.iter().enumerate() {
            let p = pattern.as_bytes();
            let longest = (p.len() - 1).min(body.len());
            if let Some(l) = (MIN_CUT_PREFIX..=longest)
                .rev()
                .find(|&l| body.ends_with(&p[..l]))
                && best.is_none_or(|(b, _)| l > b)
            {
                best = Some((l, i));
            }
        }
        if let Some((l, i)) = best {
            let start = body.len() - l;
            let tail = out[body.len()..].to_vec();
            out.truncate(start);
            out.extend_from_slice(self.replacements[i].as_bytes());
            out.extend_from_slice(&tail);
        }
        out
    }

    fn scrub_whole(&self, text: &[u8]) -> Vec<u8> {
        match &self.automaton {
            Some(ac) => ac.replace_all_bytes(text, &self.replacements),
            None => {
                let mut out = text.to_vec();
                let mut order: Vec<usize> = (0..self.patterns.len()).collect();
                order.sort_by_key(|&i| std::cmp::Reverse(self.patterns[i].len()));
                for i in order {
                    out = replace_bytes(
                        &out,
                        self.patterns[i].as_bytes(),
                        self.replacements[i].as_bytes(),
                    );
                }
                out
            }
        }
    }

    fn finds(&self, text: &[u8]) -> bool {
        match &self.automaton {
            Some(ac) => ac.is_match(text),
            None => self
                .patterns
                .iter()
                .any(|p| text.windows(p.len()).any(|w| w == p.as_bytes())),
        }
    }
}

fn replace_bytes(text: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// The shortest secret value [`Secrets::load`] accepts, in bytes (UTF-8); shorter ones,
/// empty included, stop the command (exit 2).
///
/// Scrubbing is textual: every occurrence of every form of a value is replaced,
/// wherever it is. A value of one to three bytes is a letter, a digit or a short word
/// that ordinary output is full of, so scrubbing it would mangle every log line and
/// stored output; and below five bytes the base64 forms cannot be looked for at all
/// (a value needs five bytes for each of the three alignments to have a core of
/// [`MIN_BASE64_CORE`] characters), so a downstream echoing it base64-encoded would
/// leak it. Five bytes is the least at which every form is found.
pub const MIN_SECRET_BYTES: usize = 5;

/// Shortest start of a secret replaced at the end of a cut text: shorter ones would hit
/// unrelated text too often and reveal little.
const MIN_CUT_PREFIX: usize = 3;

/// Shortest base64 run looked for: shorter runs of a short secret's encoding would match
/// unrelated base64 text too often.
const MIN_BASE64_CORE: usize = 6;

/// Every form in which `value` may come back, each with the stand-in to put in its place.
///
/// Three layers, each applied to every result of the one before:
/// 1. the value itself and its JSON-escaped forms (serde's; `\uXXXX` for non-ASCII in
///    either hex case, as Python and JavaScript encoders write; `\/`): what a JSON
///    request body holds;
/// 2. as is, percent-encoded (several common sets of characters left alone, `+` or
///    `%20` for space, either hex case), HTML-escaped (`&quot;`/`&#34;`,
///    `&#39;`/`&#x27;`/`&apos;`) and base64 (standard and URL-safe alphabets, the
///    characters that depend on the value alone at each of the three alignments);
/// 3. as is, and escaped once or twice more the way logs escape text: JSON strings (a
///    JSON log line quoting an error that quotes a JSON body), Rust `Debug` (tracing's
///    text fields), header and byte-string `Debug`.
pub fn forms(value: &str, placeholder: &str) -> Vec<(String, String)> {
    let ph = placeholder.to_string();
    let mut inner = vec![(value.to_string(), ph.clone())];
    let json_ph = json_escape(&ph);
    inner.push((json_escape(value), json_ph.clone()));
    inner.push((json_escape_ascii(value, false), json_ph.clone()));
    inner.push((json_escape_ascii(value, true), json_ph.clone()));
    inner.push((json_escape(value).replace('/', "\\/"), json_ph));
    let mut mid = Vec::new();
    for (text, replacement) in &inner {
        mid.push((text.clone(), replacement.clone()));
        for keep in URL_KEEP {
            for plus in [true, false] {
                for upper in [true, false] {
                    mid.push((percent_encode(text, keep, plus, upper), ph.clone()));
                }
            }
        }
        for (quot, apos) in HTML_QUOTES {
            mid.push((html_escape(text, quot, apos), ph.clone()));
        }
        for core in base64_cores(text.as_bytes()) {
            mid.push((core, ph.clone()));
        }
    }
    // Plain forms first, so where two escapings of a value coincide (most values have
    // nothing to escape) the plain stand-in is the one kept.
    let mut out = mid.clone();
    for (text, replacement) in mid {
        out.push((json_escape(&text), json_escape(&replacement)));
        out.push((
            json_escape(&json_escape(&text)),
            json_escape(&json_escape(&replacement)),
        ));
        out.push((debug_escape(&text), debug_escape(&replacement)));
        out.push((
            debug_escape(&json_escape(&text)),
            debug_escape(&json_escape(&replacement)),
        ));
        out.push((header_debug(&text), debug_escape(&replacement)));
        out.push((
            text.as_bytes().escape_ascii().to_string(),
            debug_escape(&replacement),
        ));
    }
    out
}

/// Punctuation that percent-encoders commonly leave as is (letters and digits always
/// are): RFC 3986 unreserved; WHATWG form encoding; `encodeURIComponent`; Python's
/// `quote`; and a lenient path encoder that only encodes space, the characters
/// `"#<>%{}` and the backquote, and non-ASCII.
const URL_KEEP: [&str; 5] = [
    "-._~",
    "*-._",
    "-_.!~*'()",
    "-_.~/",
    "!$&'()*+,-./:;=?@[\\]^_|~",
];

/// How HTML escapers write `"` and `'`.
const HTML_QUOTES: [(&str, &str); 5] = [
    ("&quot;", "&#39;"),
    ("&quot;", "&#x27;"),
    ("&#34;", "&#39;"),
    ("&quot;", "&apos;"),
    ("\"", "'"),
];

fn json_escape(s: &str) -> String {
    let quoted = Json::String(s.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// JSON escaping with every non-ASCII character as `\uXXXX` (UTF-16).
fn json_escape_ascii(s: &str, upper: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in json_escape(s).chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                if upper {
                    out.push_str(&format!("\\u{unit:04X}"));
                } else {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out
}

fn debug_escape(s: &str) -> String {
    let quoted = format!("{s:?}");
    quoted[1..quoted.len() - 1].to_string()
}

/// `http::HeaderValue`'s `Debug`: visible ASCII as is, `"` as `\"`, other bytes `\x{:x}`.
fn header_debug(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b == b'"' {
            out.push_str("\\\"");
        } else if b == b'\t' || (b' '..=b'~').contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:x}"));
        }
    }
    out
}

fn percent_encode(s: &str, keep: &str, plus: bool, upper: bool) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || keep.as_bytes().contains(&b) {
            out.push(char::from(b));
        } else if b == b' ' && plus {
            out.push('+');
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

fn html_escape(s: &str, quot: &str, apos: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str(quot),
            '\'' => out.push_str(apos),
            c => out.push(c),
        }
    }
    out
}

/// The base64 characters that depend on `bytes` alone, wherever they sit in a longer
/// encoded text: for each alignment (0, 1 or 2 bytes before them in their 3-byte group),
/// the characters whose six bits all come from `bytes`. Standard and URL-safe alphabets.
fn base64_cores(bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..3usize {
        let mut padded = vec![0u8; k];
        padded.extend_from_slice(bytes);
        let first = (8 * k).div_ceil(6);
        let end = padded.len() * 8 / 6;
        if end <= first || end - first < MIN_BASE64_CORE {
            continue;
        }
        for engine in [
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            let encoded = engine.encode(&padded);
            if let Some(core) = encoded.get(first..end) {
                out.push(core.to_string());
            }
        }
    }
    out
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Secrets {
    /// Loads the optional dotenv file, then `FLOW_SECRET_*` from the environment on top.
    pub fn load(file: Option<&Path>) -> Result<Self, Error> {
        let mut values = BTreeMap::new();
        if let Some(path) = file {
            let bytes = crate::read_limited::read(path, crate::read_limited::MAX_FILE_BYTES)
                .map_err(|e| match e {
                    crate::read_limited::Error::TooLarge { limit, .. } => Error::TooLarge {
                        path: path.display().to_string(),
                        limit,
                    },
                    other => Error::File {
                        path: path.display().to_string(),
                        reason: other.reason(),
                    },
                })?;
            let iter = dotenvy::from_read_iter(bytes.as_slice());
            for item in iter {
                let (name, value) = item.map_err(|e| Error::File {
                    path: path.display().to_string(),
                    reason: describe(&e),
                })?;
                values.insert(
                    name.strip_prefix(ENV_PREFIX).unwrap_or(&name).to_string(),
                    value,
                );
            }
        }
        for (key, value) in std::env::vars() {
            if let Some(name) = key.strip_prefix(ENV_PREFIX)
                && !name.is_empty()
            {
                values.insert(name.to_string(), value);
            }
        }
        let short: Vec<String> = values
            .iter()
            .filter(|(_, v)| v.len() < MIN_SECRET_BYTES)
            .map(|(n, _)| n.clone())
            .collect();
        if !short.is_empty() {
            return Err(Error::TooShort {
                names: short,
                min: MIN_SECRET_BYTES,
            });
        }
        Ok(Self::from_values(values))
    }

    /// Secrets from explicit pairs (embedders, tests). Unlike [`Secrets::load`] it does
    /// not refuse values under [`MIN_SECRET_BYTES`]: the embedder chose them.
    pub fn from_pairs<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        Self::from_values(pairs.into_iter().collect())
    }

    /// The one constructor: the scrubber is compiled here, once per set of secrets.
    fn from_values(values: BTreeMap<String, String>) -> Self {
        let scrubber = Scrubber::new(&values).map(Arc::new);
        Self { values, scrubber }
    }

    /// The value of a secret.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The names of every loaded secret.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// The expression-context object for the named secrets: real values, or, with
    /// `redacted`, `{"$secret": NAME}` stand-ins. Missing names are left out, so an
    /// expression reading one fails with a clear "undefined" error (checked earlier by
    /// [`Secrets::missing`]).
    pub fn context<'a>(&self, names: impl IntoIterator<Item = &'a str>, redacted: bool) -> Json {
        let mut map = serde_json::Map::new();
        for name in names {
            if let Some(value) = self.get(name) {
                let v = if redacted {
                    placeholder(name)
                } else {
                    Json::String(value.to_string())
                };
                map.insert(name.to_string(), v);
            }
        }
        Json::Object(map)
    }

    /// These secrets plus one more value, scrubbed as `{"$secret": NAME}` (a callback
    /// token: a credential of one call, never written anywhere).
    pub fn with_value(&self, name: &str, value: &str) -> Secrets {
        let mut values = self.values.clone();
        values.insert(name.to_owned(), value.to_owned());
        Secrets::from_values(values)
    }

    /// The first of `names` that has no value.
    pub fn missing<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
        names.into_iter().find(|n| self.get(n).is_none())
    }

    /// Every one of `names` that has no value, in order (what a run checks up front, so
    /// it can name all of them at once).
    pub fn missing_all<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        names
            .into_iter()
            .filter(|n| self.get(n).is_none())
            .collect()
    }

    /// Replaces every form of every secret value inside `text` (see [`forms`]) by its
    /// stand-in, in one pass.
    pub fn scrub(&self, text: &str) -> String {
        match &self.scrubber {
            None => text.to_string(),
            Some(scrubber) => String::from_utf8(scrubber.scrub(text.as_bytes()))
                // Replacements are UTF-8 and matches start and end on pattern bytes that
                // are UTF-8, so this holds; the lossy path is only a fallback.
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        }
    }

    /// [`Secrets::scrub`] over bytes (log lines, which need not be UTF-8).
    pub fn scrub_bytes(&self, text: &[u8]) -> Vec<u8> {
        match &self.scrubber {
            None => text.to_vec(),
            Some(scrubber) => scrubber.scrub(text),
        }
    }

    /// Whether any form of any secret occurs in `text`.
    pub fn finds(&self, text: &[u8]) -> bool {
        self.scrubber.as_ref().is_some_and(|s| s.finds(text))
    }

    /// [`Secrets::scrub`] applied to every string (and object key) in a JSON value.
    pub fn scrub_json(&self, value: &Json) -> Json {
        if self.scrubber.is_none() {
            return value.clone();
        }
        match value {
            Json::String(s) => Json::String(self.scrub(s)),
            Json::Array(items) => Json::Array(items.iter().map(|v| self.scrub_json(v)).collect()),
            Json::Object(map) => Json::Object(
                map.iter()
                    .map(|(k, v)| (self.scrub(k), self.scrub_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// `{"$secret": NAME}`: what the ledger stores instead of a whole secret value.
pub fn placeholder(name: &str) -> Json {
    let mut map = serde_json::Map::new();
    map.insert(REDACTED_KEY.to_string(), Json::String(name.to_string()));
    Json::Object(map)
}

/// The stand-in used inside a longer string (`Bearer {"$secret":"TOKEN"}`).
pub fn placeholder_text(name: &str) -> String {
    placeholder(name).to_string()
}

/// dotenvy errors can quote the offending line, which may hold a value: describe the
/// error by kind only.
fn describe(e: &dotenvy::Error) -> String {
    match e {
        dotenvy::Error::LineParse(_, index) => format!("syntax error at character {index}"),
        dotenvy::Error::Io(io) => io.to_string(),
        dotenvy::Error::EnvVar(_) => "invalid variable".to_string(),
        _ => "unreadable".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scrub_replaces_values_everywhere() {
        let s = Secrets::from_pairs([
            ("TOKEN".into(), "s3cr3t-value".into()),
            ("PIN".into(), "s3cr3t".into()),
        ]);
        assert_eq!(
            s.scrub("Bearer s3cr3t-value and s3cr3t"),
            r#"Bearer {"$secret":"TOKEN"} and {"$secret":"PIN"}"#
        );
        let v = s.scrub_json(&json!({"echo": ["s3cr3t-value"], "s3cr3t": 1}));
        assert_eq!(
            v,
            json!({"echo": [r#"{"$secret":"TOKEN"}"#], r#"{"$secret":"PIN"}"#: 1})
        );
    }

    #[test]
    fn escaped_and_encoded_echoes_are_scrubbed_in_one_pass() {
        let s = Secrets::from_pairs([
            ("PW".into(), "hunter\"2".into()),
            ("KEY".into(), "AbC+dEf/GhI=".into()),
            ("UNI".into(), "pässwörd€".into()),
            ("HTML".into(), "<a&b'c>".into()),
        ]);
        // A 400 body echoing a JSON request body: the stand-in is JSON-escaped too, so
        // the echoed document is still JSON.
        assert_eq!(
            s.scrub(r#"HTTP 400: {"password":"hunter\"2"}"#),
            r#"HTTP 400: {"password":"{\"$secret\":\"PW\"}"}"#
        );
        for echoed in [
            "AbC%2BdEf%2FGhI%3D",
            "AbC%2bdEf%2fGhI%3d",
            "p%C3%A4ssw%C3%B6rd%E2%82%AC",
            "p\\u00e4ssw\\u00f6rd\\u20ac",
            "p\\u00E4ssw\\u00F6rd\\u20AC",
            "&lt;a&amp;b&#39;c&gt;",
            "&lt;a&amp;b&#x27;c&gt;",
            "hunter&quot;2",
            "hunter%5C%222",
            r#"hunter\\\"2"#,
        ] {
            let out = s.scrub(&format!("echo: [{echoed}]"));
            assert!(out.contains("$secret"), "{echoed} was not scrubbed: {out}");
            assert!(!out.contains(echoed), "{echoed}: {out}");
        }
        // base64 of a text holding the value, at each alignment.
        for prefix in ["", "x", "xy"] {
            let text = base64::engine::general_purpose::STANDARD
                .encode(format!("{prefix}{{\"key\":\"AbC+dEf/GhI=\"}}"));
            let out = s.scrub(&text);
            assert!(out.contains("$secret"), "{prefix:?}: {text} -> {out}");
        }
        // Text without a secret is left alone.
        assert_eq!(s.scrub("nothing here: hunter 2"), "nothing here: hunter 2");
    }

    #[test]
    fn the_start_of_a_secret_at_a_cut_is_replaced() {
        let s = Secrets::from_pairs([("PW".into(), "pässwörd-long".into())]);
        // As the HTTP adapter quotes an error body: its first bytes, then `…`.
        let body = format!("{{\"password\":\"{}\"}}", "pässwörd-long");
        for cut in [body.len() - 6, body.len() - 10, 16] {
            let bytes = &body.as_bytes()[..cut];
            let message = format!("HTTP 400: {}…", String::from_utf8_lossy(bytes).trim());
            let out = s.scrub(&message);
            assert!(out.contains(r#"{"$secret":"PW"}"#), "{message} -> {out}");
            assert!(
                !out.contains("pä") && out.ends_with('…'),
                "{message} -> {out}"
            );
        }
        // Without the mark, or with too short a start, nothing is cut.
        assert_eq!(s.scrub("ends in pä"), "ends in pä");
        assert_eq!(s.scrub("ends in p…"), "ends in p…");
    }

    #[test]
    fn a_longer_secret_holding_a_shorter_one_is_replaced_whole() {
        let s = Secrets::from_pairs([
            ("LONG".into(), "abc-def-ghi".into()),
            ("SHORT".into(), "def".into()),
        ]);
        assert_eq!(
            s.scrub("abc-def-ghi def"),
            r#"{"$secret":"LONG"} {"$secret":"SHORT"}"#
        );
    }

    #[test]
    fn context_is_redacted_on_request() {
        let s = Secrets::from_pairs([("A".into(), "x".into())]);
        assert_eq!(s.context(["A", "B"], false), json!({"A": "x"}));
        assert_eq!(s.context(["A"], true), json!({"A": {"$secret": "A"}}));
        assert_eq!(s.missing(["A", "B"]), Some("B"));
    }

    /// The minimum is where scrubbing can look for every form: from it on each of the
    /// three base64 alignments, in both alphabets, has a core; one byte less and not.
    #[test]
    fn the_minimum_is_the_shortest_value_with_every_base64_form() {
        assert_eq!(base64_cores(&[b'x'; MIN_SECRET_BYTES]).len(), 6);
        assert!(base64_cores(&[b'x'; MIN_SECRET_BYTES - 1]).len() < 6);
    }

    #[test]
    fn values_under_the_minimum_are_refused_by_name_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secrets.env");
        std::fs::write(&path, "PIN=7319\nEMPTY=\nOK=73195\n").expect("write");
        let err = Secrets::load(Some(&path)).expect_err("too short");
        let Error::TooShort { names, min } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(
            (names.as_slice(), *min),
            (["EMPTY".to_string(), "PIN".to_string()].as_slice(), 5)
        );
        let text = err.to_string();
        assert!(
            text.contains("secret `PIN` is") && text.contains("secret `EMPTY` is"),
            "{text}"
        );
        assert!(!text.contains("7319"), "{text}");
        std::fs::write(&path, "OK=73195\n").expect("write");
        assert_eq!(
            Secrets::load(Some(&path)).expect("loads").get("OK"),
            Some("73195")
        );
    }

    #[test]
    fn dotenv_file_and_debug_never_show_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secrets.env");
        std::fs::write(&path, "API_TOKEN=abc123\nFLOW_SECRET_OTHER=\"q w e\"\n").expect("write");
        let s = Secrets::load(Some(&path)).expect("loads");
        assert_eq!(s.get("API_TOKEN"), Some("abc123"));
        assert_eq!(s.get("OTHER"), Some("q w e"));
        assert!(!format!("{s:?}").contains("abc123"));
        std::fs::write(&path, "GOOD=1\nBAD LINE=oops-secret\n").expect("write");
        let err = Secrets::load(Some(&path))
            .expect_err("bad file")
            .to_string();
        assert!(!err.contains("oops-secret"), "{err}");
    }
}
