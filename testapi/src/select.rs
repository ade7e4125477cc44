//! Field and label selectors. Field selectors: `key=value`, `key==value`, `key!=value`, comma-separated (all must
//! hold), on the fields each kind makes selectable. Label selectors, as the apiserver parses them: `k=v`, `k==v`,
//! `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not exist), `k>1`, `k<1` (integers),
//! comma-separated, blanks allowed between tokens, keys and values checked as label keys and values.

use serde_json::Value;

/// The field paths a field selector may name, per kind; anything else is refused with 400 as the real
/// apiserver does.
fn field_path(kind: &str, field: &str) -> Option<&'static [&'static str]> {
    Some(match (kind, field) {
        (_, "metadata.name") => &["metadata", "name"],
        (_, "metadata.namespace") => &["metadata", "namespace"],
        ("Pod", "spec.nodeName") => &["spec", "nodeName"],
        ("Pod", "status.phase") => &["status", "phase"],
        ("Event", "involvedObject.name") => &["involvedObject", "name"],
        ("Event", "involvedObject.kind") => &["involvedObject", "kind"],
        ("Event", "involvedObject.namespace") => &["involvedObject", "namespace"],
        ("Event", "involvedObject.uid") => &["involvedObject", "uid"],
        ("Event", "reason") => &["reason"],
        ("Event", "type") => &["type"],
        _ => return None,
    })
}

/// One requirement of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    key: String,
    value: String,
    equal: bool,
}

fn field_requirements(text: &str) -> Result<Vec<FieldRequirement>, String> {
    let mut out = Vec::new();
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (key, value, equal) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, false)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once('=') {
            (k, v, true)
        } else {
            return Err(format!("invalid selector: {term:?}: only =, == and != are supported"));
        };
        out.push(FieldRequirement { key: key.trim().to_owned(), value: value.trim().to_owned(), equal });
    }
    Ok(out)
}

/// What a label requirement asks of a label.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    /// `=`, `==`, `in`: present, with one of the values.
    In(Vec<String>),
    /// `!=`, `notin`: absent, or with none of the values.
    NotIn(Vec<String>),
    /// `key`: present.
    Exists,
    /// `!key`: absent.
    DoesNotExist,
    /// `key>n`: present, an integer greater than n.
    Gt(i64),
    /// `key<n`: present, an integer less than n.
    Lt(i64),
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

impl LabelRequirement {
    fn matches(&self, labels: &Value) -> bool {
        let label = labels.get(&self.key);
        let text = label.and_then(Value::as_str);
        match &self.op {
            LabelOp::In(values) => text.is_some_and(|v| values.iter().any(|x| x == v)),
            LabelOp::NotIn(values) => text.is_none_or(|v| !values.iter().any(|x| x == v)),
            LabelOp::Exists => label.is_some(),
            LabelOp::DoesNotExist => label.is_none(),
            LabelOp::Gt(n) => text.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
            LabelOp::Lt(n) => text.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
        }
    }
}

/// A token of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    End,
    Word(String),
    In,
    NotIn,
    Open,
    Close,
    Comma,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
}

impl Token {
    /// The text of the token, as error messages quote it.
    fn text(&self) -> &str {
        match self {
            Token::End => "",
            Token::Word(w) => w,
            Token::In => "in",
            Token::NotIn => "notin",
            Token::Open => "(",
            Token::Close => ")",
            Token::Comma => ",",
            Token::Bang => "!",
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::NotEquals => "!=",
            Token::Greater => ">",
            Token::Less => "<",
        }
    }

    /// Where values are expected `in` and `notin` are plain words.
    fn into_value(self) -> Token {
        match self {
            Token::In | Token::NotIn => Token::Word(self.text().to_owned()),
            t => t,
        }
    }
}

fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_symbol(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Splits a label selector into tokens: symbols (the two-character `==` and `!=` taken whole), and words running
/// to the next blank or symbol; `in` and `notin` are keywords. The list ends with [`Token::End`].
fn tokens(text: &str) -> Vec<Token> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if is_blank(b) {
            i += 1;
            continue;
        }
        if is_symbol(b) {
            let doubled = bytes.get(i + 1) == Some(&b'=') && matches!(b, b'=' | b'!');
            out.push(match (b, doubled) {
                (b'=', true) => Token::DoubleEquals,
                (b'!', true) => Token::NotEquals,
                (b'=', _) => Token::Equals,
                (b'!', _) => Token::Bang,
                (b'(', _) => Token::Open,
                (b')', _) => Token::Close,
                (b',', _) => Token::Comma,
                (b'>', _) => Token::Greater,
                _ => Token::Less,
            });
            i += if doubled { 2 } else { 1 };
            continue;
        }
        let start = i;
        while i < bytes.len() && !is_blank(bytes[i]) && !is_symbol(bytes[i]) {
            i += 1;
        }
        // Blanks and symbols are ASCII, so `start..i` falls on character boundaries.
        out.push(match &text[start..i] {
            "in" => Token::In,
            "notin" => Token::NotIn,
            word => Token::Word(word.to_owned()),
        });
    }
    out.push(Token::End);
    out
}

/// A recursive-descent parser over the tokens of a label selector.
struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    /// The next token, without taking it; as a value (`in`, `notin` as words) unless `operator`.
    fn peek(&self, operator: bool) -> Token {
        let t = self.tokens.get(self.at).cloned().unwrap_or(Token::End);
        if operator { t } else { t.into_value() }
    }

    /// The next token, taken.
    fn next(&mut self, operator: bool) -> Token {
        let t = self.peek(operator);
        self.at = (self.at + 1).min(self.tokens.len());
        t
    }

    fn selector(&mut self) -> Result<Vec<LabelRequirement>, String> {
        let mut out = Vec::new();
        loop {
            match self.peek(false) {
                Token::Word(_) | Token::Bang => {
                    out.push(self.requirement().map_err(|e| format!("unable to parse requirement: {e}"))?);
                    match self.next(false) {
                        Token::End => return Ok(out),
                        Token::Comma => {
                            let t = self.peek(false);
                            if !matches!(t, Token::Word(_) | Token::Bang) {
                                return Err(format!("found '{}', expected: identifier after ','", t.text()));
                            }
                        }
                        t => return Err(format!("found '{}', expected: ',' or 'end of string'", t.text())),
                    }
                }
                Token::End => return Ok(out),
                t => return Err(format!("found '{}', expected: !, identifier, or 'end of string'", t.text())),
            }
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, String> {
        let mut t = self.next(false);
        let negated = t == Token::Bang;
        if negated {
            t = self.next(false);
        }
        let Token::Word(key) = t else { return Err(format!("found '{}', expected: identifier", t.text())) };
        check_key(&key)?;
        if negated {
            return Ok(LabelRequirement { key, op: LabelOp::DoesNotExist });
        }
        if matches!(self.peek(false), Token::End | Token::Comma) {
            return Ok(LabelRequirement { key, op: LabelOp::Exists });
        }
        let op = self.next(true);
        let values = match op {
            Token::In | Token::NotIn => self.value_set()?,
            Token::Equals | Token::DoubleEquals | Token::NotEquals | Token::Greater | Token::Less => {
                vec![self.exact_value()?]
            }
            t => return Err(format!("found '{}', expected: in, notin, =, ==, !=, gt, lt", t.text())),
        };
        let integer = || {
            values[0].parse::<i64>().map_err(|_| {
                format!(
                    "values[0]: Invalid value: {:?}: for 'Gt', 'Lt' operators, the value must be an integer",
                    values[0]
                )
            })
        };
        let op = match op {
            Token::In | Token::Equals | Token::DoubleEquals => LabelOp::In(values.clone()),
            Token::Greater => LabelOp::Gt(integer()?),
            Token::Less => LabelOp::Lt(integer()?),
            _ => LabelOp::NotIn(values.clone()),
        };
        for (i, v) in values.iter().enumerate() {
            check_value(v).map_err(|e| format!("values[{i}][{key}]: Invalid value: {v:?}: {e}"))?;
        }
        Ok(LabelRequirement { key, op })
    }

    /// `( a, b, ... )`; empty entries are the empty value.
    fn value_set(&mut self) -> Result<Vec<String>, String> {
        let t = self.next(false);
        if t != Token::Open {
            return Err(format!("found '{}' expected: '('", t.text()));
        }
        fn add(v: String, values: &mut Vec<String>) {
            if !values.contains(&v) {
                values.push(v);
            }
        }
        let mut values: Vec<String> = Vec::new();
        // Expecting a value (or a comma, meaning an empty one) until the closing parenthesis.
        let mut want_value = true;
        loop {
            match self.next(false) {
                Token::Word(w) if want_value => {
                    add(w, &mut values);
                    want_value = false;
                }
                Token::Comma => {
                    if want_value {
                        add(String::new(), &mut values);
                    }
                    want_value = true;
                }
                Token::Close => {
                    if want_value {
                        add(String::new(), &mut values);
                    }
                    return Ok(values);
                }
                t if want_value => return Err(format!("found '{}', expected: ',', ')' or identifier", t.text())),
                t => return Err(format!("found '{}', expected: ',' or ')'", t.text())),
            }
        }
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; nothing before a comma or the end is the empty value.
    fn exact_value(&mut self) -> Result<String, String> {
        match self.peek(false) {
            Token::End | Token::Comma => Ok(String::new()),
            Token::Word(w) => {
                self.next(false);
                Ok(w)
            }
            t => Err(format!("found '{}', expected: identifier", t.text())),
        }
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, the shape of a label name and of a non-empty label value.
fn is_label_word(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A lowercase RFC 1123 subdomain: dot-separated labels of `[a-z0-9]`, `-` inside, at most 253 bytes.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            b.first().is_some_and(edge)
                && b.last().is_some_and(edge)
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

const NAME_RULE: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// A label key: a name of at most 63 bytes, optionally after a DNS subdomain prefix and `/`.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        None => (None, key),
        Some((_, name)) if name.contains('/') => {
            return Err(format!(
                "key: Invalid value: {key:?}: a label key is a name with an optional DNS subdomain prefix and '/' \
                 (e.g. 'example.com/MyName')"
            ));
        }
        Some((prefix, name)) => (Some(prefix), name),
    };
    let mut errors = Vec::new();
    match prefix {
        Some("") => errors.push("prefix part must be non-empty".to_owned()),
        Some(p) if !is_dns_subdomain(p) => errors.push(
            "prefix part must be a lowercase RFC 1123 subdomain of at most 253 bytes (e.g. 'example.com')".to_owned(),
        ),
        _ => {}
    }
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 bytes".to_owned());
    }
    if !is_label_word(name) {
        errors.push(format!("name part {NAME_RULE} (e.g. 'MyName', 'my.name' or '123-abc')"));
    }
    if errors.is_empty() { Ok(()) } else { Err(format!("key: Invalid value: {key:?}: {}", errors.join("; "))) }
}

/// A label value: empty, or a name of at most 63 bytes.
fn check_value(value: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 bytes".to_owned());
    }
    if !value.is_empty() && !is_label_word(value) {
        errors.push(format!("a valid label must be an empty string or {NAME_RULE}"));
    }
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

/// Parses a label selector; the empty selector selects everything.
fn label_requirements(text: &str) -> Result<Vec<LabelRequirement>, String> {
    Parser { tokens: tokens(text), at: 0 }.selector()
}

/// A parsed selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    fields: Vec<(&'static [&'static str], FieldRequirement)>,
    labels: Vec<LabelRequirement>,
}

impl Selector {
    /// Parses the `fieldSelector` and `labelSelector` of a request for objects of `kind`. The error says what is
    /// wrong with either, for a 400.
    pub fn parse(kind: &str, fields: Option<&str>, labels: Option<&str>) -> Result<Selector, String> {
        let mut s = Selector::default();
        for r in field_requirements(fields.unwrap_or(""))? {
            let Some(path) = field_path(kind, &r.key) else {
                return Err(format!("field label not supported: {}", r.key));
            };
            s.fields.push((path, r));
        }
        s.labels = label_requirements(labels.unwrap_or(""))?;
        Ok(s)
    }

    /// True when `object` matches every requirement (a missing field reads as empty).
    pub fn matches(&self, object: &Value) -> bool {
        let fields = self.fields.iter().all(|(path, r)| {
            let v = path.iter().try_fold(object, |v, k| v.get(k)).and_then(Value::as_str).unwrap_or("");
            (v == r.value) == r.equal
        });
        let labels = &object["metadata"]["labels"];
        fields && self.labels.iter().all(|r| r.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_fields_and_labels() {
        let pod = json!({"metadata": {"name": "p", "labels": {"app": "web"}}, "spec": {"nodeName": "n1"}});
        let s = |f, l| Selector::parse("Pod", f, l).unwrap();
        assert!(s(Some("spec.nodeName=n1"), None).matches(&pod));
        assert!(s(Some("spec.nodeName==n1,metadata.name!=q"), Some("app=web")).matches(&pod));
        assert!(!s(Some("spec.nodeName=n2"), None).matches(&pod));
        assert!(s(Some("spec.nodeName!=n2"), None).matches(&pod));
        assert!(s(Some("status.phase="), None).matches(&pod), "a missing field reads as empty");
        assert!(!s(None, Some("app!=web")).matches(&pod));
        assert!(s(None, Some("tier!=db")).matches(&pod));
        assert!(Selector::parse("Pod", Some("spec.hostname=x"), None).is_err());
        assert!(Selector::parse("Node", Some("spec.nodeName=x"), None).is_err());
        assert!(Selector::parse("Pod", Some("spec.nodeName"), None).is_err());
        assert!(s(Some(""), Some("")).matches(&pod));
    }

    fn labels(text: &str) -> Vec<LabelRequirement> {
        label_requirements(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn req(key: &str, op: LabelOp) -> LabelRequirement {
        LabelRequirement { key: key.to_owned(), op }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn label_selectors_parse() {
        assert_eq!(labels(""), []);
        assert_eq!(labels("  "), []);
        assert_eq!(labels("a=b"), [req("a", LabelOp::In(strings(&["b"])))]);
        assert_eq!(labels("a==b"), [req("a", LabelOp::In(strings(&["b"])))]);
        assert_eq!(labels("a!=b"), [req("a", LabelOp::NotIn(strings(&["b"])))]);
        assert_eq!(labels("a="), [req("a", LabelOp::In(strings(&[""])))], "an empty value");
        assert_eq!(labels("a in (x, y)"), [req("a", LabelOp::In(strings(&["x", "y"])))]);
        assert_eq!(labels("a notin (x,y,x)"), [req("a", LabelOp::NotIn(strings(&["x", "y"])))]);
        assert_eq!(labels("a in ()"), [req("a", LabelOp::In(strings(&[""])))]);
        assert_eq!(labels("a in (,x)"), [req("a", LabelOp::In(strings(&["", "x"])))]);
        assert_eq!(labels("a in (x,)"), [req("a", LabelOp::In(strings(&["x", ""])))]);
        assert_eq!(labels("a in (x,,y)"), [req("a", LabelOp::In(strings(&["x", "", "y"])))]);
        assert_eq!(labels("a"), [req("a", LabelOp::Exists)]);
        assert_eq!(labels("!a"), [req("a", LabelOp::DoesNotExist)]);
        assert_eq!(labels("! a"), [req("a", LabelOp::DoesNotExist)]);
        assert_eq!(labels("a>5"), [req("a", LabelOp::Gt(5))]);
        assert_eq!(labels("a < 10"), [req("a", LabelOp::Lt(10))]);
        assert_eq!(
            labels(" x in (foo,,baz), y,z notin (), !w , k == v\t,\nin in (in, notin)"),
            [
                req("x", LabelOp::In(strings(&["foo", "", "baz"]))),
                req("y", LabelOp::Exists),
                req("z", LabelOp::NotIn(strings(&[""]))),
                req("w", LabelOp::DoesNotExist),
                req("k", LabelOp::In(strings(&["v"]))),
                req("in", LabelOp::In(strings(&["in", "notin"]))),
            ]
        );
        assert_eq!(
            labels("kubernetes.io/hostname=n1,node-role.kubernetes.io/control-plane"),
            [
                req("kubernetes.io/hostname", LabelOp::In(strings(&["n1"]))),
                req("node-role.kubernetes.io/control-plane", LabelOp::Exists)
            ]
        );
    }

    #[test]
    fn label_selector_syntax_errors() {
        let err = |text: &str| label_requirements(text).unwrap_err();
        assert_eq!(err("a b"), "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt");
        assert_eq!(err("a=b c"), "found 'c', expected: ',' or 'end of string'");
        assert_eq!(err("a=b,"), "found '', expected: identifier after ','");
        assert_eq!(err("a=b,,c"), "found ',', expected: identifier after ','");
        assert_eq!(err(",a"), "found ',', expected: !, identifier, or 'end of string'");
        assert_eq!(err("=a"), "found '=', expected: !, identifier, or 'end of string'");
        assert_eq!(err("!a=b"), "found '=', expected: ',' or 'end of string'");
        assert_eq!(err("!"), "unable to parse requirement: found '', expected: identifier");
        assert_eq!(err("a in x"), "unable to parse requirement: found 'x' expected: '('");
        assert_eq!(err("a in (x"), "unable to parse requirement: found '', expected: ',' or ')'");
        assert_eq!(err("a in (x y)"), "unable to parse requirement: found 'y', expected: ',' or ')'");
        assert_eq!(err("a in (=)"), "unable to parse requirement: found '=', expected: ',', ')' or identifier");
        assert_eq!(err("a in"), "unable to parse requirement: found '' expected: '('");
        assert_eq!(err("a=(b)"), "unable to parse requirement: found '(', expected: identifier");
        assert_eq!(err("a=b=c"), "found '=', expected: ',' or 'end of string'");
        assert!(err("a>b").contains("must be an integer"), "{}", err("a>b"));
        assert!(err("a<1.5").contains("must be an integer"));
        assert!(err("a>-1").contains("Invalid value"), "a negative number is no label value");
    }

    #[test]
    fn label_keys_and_values_are_checked() {
        for good in
            ["a", "A1", "a.b-c_d", "example.com/a", "a.b.c/x", &"k".repeat(63), &format!("{}/a", "d".repeat(253))]
        {
            assert!(label_requirements(good).is_ok(), "{good}");
        }
        for bad in [
            "-a",
            "a-",
            "a:b",
            "/a",
            "a/",
            "a/b/c",
            "Example.com/a",
            "ex_ample.com/a",
            "-x.com/a",
            "a@b",
            "é",
            &"k".repeat(64),
            &format!("{}/a", "d".repeat(254)),
        ] {
            let e = label_requirements(bad).unwrap_err();
            assert!(e.starts_with("unable to parse requirement: ") && e.contains("Invalid value"), "{bad}: {e}");
        }
        for good in ["a=", "a=A.b-c_9", &format!("a={}", "v".repeat(63)), "a in (x, y.z)"] {
            assert!(label_requirements(good).is_ok(), "{good}");
        }
        for bad in ["a=-v", "a=v_", "a=v/w", "a=ü", &format!("a={}", "v".repeat(64)), "a in (ok, -bad)"] {
            let e = label_requirements(bad).unwrap_err();
            assert!(e.contains("Invalid value"), "{bad}: {e}");
        }
        let e = label_requirements("a/b/c=x").unwrap_err();
        assert!(e.contains("\"a/b/c\""), "{e}");
        let e = label_requirements("app in (ok,-bad)").unwrap_err();
        assert!(e.contains("values[1][app]: Invalid value: \"-bad\""), "{e}");
    }

    #[test]
    fn label_selectors_match() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "", "n": "10", "x": "notanumber"}}});
        let bare = json!({"metadata": {"name": "no-labels"}});
        let m = |text: &str, o: &Value| Selector::parse("ConfigMap", None, Some(text)).unwrap().matches(o);
        assert!(m("app=web", &obj) && m("app==web", &obj) && m("app in (db, web)", &obj));
        assert!(!m("app=db", &obj) && !m("app in (db)", &obj) && !m("app=web", &bare));
        assert!(m("app!=db", &obj) && m("app notin (db)", &obj) && !m("app notin (web)", &obj));
        assert!(m("app!=web", &bare) && m("app notin (web)", &bare), "an absent label is not any value");
        assert!(m("tier=", &obj) && m("tier in ()", &obj) && !m("tier", &bare) && m("tier", &obj));
        assert!(m("!zone", &obj) && !m("!app", &obj) && m("!app", &bare));
        assert!(m("n>9", &obj) && !m("n>10", &obj) && m("n<11", &obj) && !m("n<10", &obj));
        assert!(!m("x>1", &obj) && !m("x<1", &obj) && !m("n>1", &bare), "not an integer, or absent: no match");
        assert!(m("app=web,tier,!zone,n>1", &obj) && !m("app=web,zone", &obj), "every requirement must hold");
        assert!(m("", &bare));
        assert!(Selector::parse("Pod", None, Some("app in (")).is_err());
    }
}
