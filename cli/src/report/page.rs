//! The HTML around the charts: a page with inline CSS, sections, figures and tables. The
//! page is well-formed XML (XHTML syntax), so a test can parse it with an XML parser.

use std::fmt::Write as _;

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;\
text-align:left;font-size:.9em}th{background:#f3f3f3}.pass{color:#2a7d2a;font-weight:bold}\
.fail{color:#c62828;font-weight:bold}figure{margin:1em 0}figcaption{font-size:.85em;color:#555}\
.note{color:#555;font-size:.9em}figure{overflow-x:auto}";

/// Escapes text for HTML/XML content and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page being written.
pub struct Page {
    body: String,
    title: String,
}

impl Page {
    pub fn new(title: &str) -> Page {
        Page {
            body: String::new(),
            title: title.to_string(),
        }
    }

    /// A heading and a paragraph (`class` may be empty).
    pub fn heading(&mut self, level: u8, text: &str) {
        let _ = write!(self.body, "<h{level}>{}</h{level}>", escape(text));
    }

    pub fn paragraph(&mut self, class: &str, text: &str) {
        let _ = write!(self.body, "<p class=\"{class}\">{}</p>", escape(text));
    }

    /// A chart with an `id` and a caption, or the reason it could not be drawn.
    pub fn figure(&mut self, id: &str, svg: Result<String, String>, caption: &str) {
        let _ = write!(self.body, "<figure id=\"{id}\">");
        match svg {
            Ok(svg) => self.body.push_str(&svg),
            Err(e) => {
                let _ = write!(self.body, "<p class=\"fail\">{}</p>", escape(&e));
            }
        }
        let _ = write!(
            self.body,
            "<figcaption>{}</figcaption></figure>",
            escape(caption)
        );
    }

    /// A table with a header row; `class_of` may give a cell's class (by row, column).
    pub fn table(
        &mut self,
        id: &str,
        header: &[&str],
        rows: &[Vec<String>],
        class_of: impl Fn(usize, usize) -> &'static str,
    ) {
        let _ = write!(self.body, "<table id=\"{id}\"><tr>");
        for h in header {
            let _ = write!(self.body, "<th>{}</th>", escape(h));
        }
        self.body.push_str("</tr>");
        for (r, row) in rows.iter().enumerate() {
            self.body.push_str("<tr>");
            for (c, cell) in row.iter().enumerate() {
                let _ = write!(
                    self.body,
                    "<td class=\"{}\">{}</td>",
                    class_of(r, c),
                    escape(cell)
                );
            }
            self.body.push_str("</tr>");
        }
        self.body.push_str("</table>");
    }

    /// The whole document.
    pub fn finish(self) -> String {
        format!(
            "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\"><head>\
             <meta charset=\"utf-8\"/><title>{}</title><style>{STYLE}</style></head><body>{}\
             </body></html>\n",
            escape(&self.title),
            self.body
        )
    }
}

/// A JSON value as a table cell: numbers with at most three decimals, null as "–".
pub fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "–".into(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (_, Some(i), _) => i.to_string(),
            (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.0}"),
            (_, _, Some(f)) => format!("{f:.3}"),
            _ => n.to_string(),
        },
        serde_json::Value::Object(o) if o.is_empty() => "–".into(),
        serde_json::Value::Object(o) => o
            .iter()
            .map(|(k, v)| format!("{k}: {}", cell(v)))
            .collect::<Vec<_>>()
            .join(", "),
        serde_json::Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// A JSON array's items (none if it is not one).
pub fn list(v: &serde_json::Value) -> &[serde_json::Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}
