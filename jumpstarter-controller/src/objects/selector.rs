//! Kubernetes label selectors: one parser for the full string syntax, matching, validation of
//! keys and values as the API server does, and conversion to and from `metav1.LabelSelector`.
//!
//! Grammar (as `k8s.io/apimachinery/pkg/labels.Parse`):
//! `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`, joined by `,`.
//! Values may be empty (`key=` means "value is the empty string"); `key in ()` means `key in ("")`.

use std::collections::BTreeMap;
use std::fmt;

pub use jumpstarter_core::labels::{
    validate_dns1123_subdomain, validate_label_value, validate_qualified_name,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

/// A selector that failed to parse or validate. Every message names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The selector string does not follow the grammar.
    #[error("invalid label selector {selector:?} at position {position}: {message}")]
    Syntax {
        /// The whole selector string.
        selector: String,
        /// Byte offset of the offending token.
        position: usize,
        /// What was found and what was expected.
        message: String,
    },
    /// A key is not a valid qualified name.
    #[error("invalid label selector key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key.
        key: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A value is not a valid label value.
    #[error("invalid label selector value {value:?} for key {key:?}: {reason}")]
    InvalidValue {
        /// The key the value belongs to.
        key: String,
        /// The offending value.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A structured (`metav1.LabelSelector`) requirement is inconsistent.
    #[error("invalid label selector requirement for key {key:?}: {reason}")]
    InvalidRequirement {
        /// The key of the requirement.
        key: String,
        /// Why it is invalid (unknown operator, wrong number of values).
        reason: String,
    },
}

/// The operator of one requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key=value` or `key==value`.
    Equals,
    /// `key!=value`: matches when the label is absent or differs.
    NotEquals,
    /// `key in (a,b)`.
    In,
    /// `key notin (a,b)`: matches when the label is absent or not in the set.
    NotIn,
    /// `key`: the label is present.
    Exists,
    /// `!key`: the label is absent.
    DoesNotExist,
}

/// One requirement of a selector: all requirements must match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// The label key (a qualified name).
    pub key: String,
    /// How the key's value is tested.
    pub operator: Operator,
    /// The values: one for `Equals`/`NotEquals`, at least one (sorted, unique) for `In`/`NotIn`,
    /// none for `Exists`/`DoesNotExist`.
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether this requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::Equals | Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotEquals | Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.operator {
            Operator::Equals => write!(f, "{}={}", self.key, first),
            Operator::NotEquals => write!(f, "{}!={}", self.key, first),
            Operator::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
        }
    }
}

/// A parsed, validated label selector: a conjunction of requirements, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parse the Kubernetes selector string syntax. `""` (or only whitespace) selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let tokens = lex(s)?;
        let mut parser = Parser {
            selector: s,
            tokens,
            pos: 0,
        };
        let mut requirements = parser.parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// The selector that matches every label set.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Build a selector from requirements, validating each one.
    pub fn from_requirements(
        requirements: impl IntoIterator<Item = Requirement>,
    ) -> Result<Self, SelectorError> {
        let mut out = Vec::new();
        for r in requirements {
            out.push(new_requirement(r.key, r.operator, r.values)?);
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements: out })
    }

    /// Whether the selector has no requirements (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Convert a `metav1.LabelSelector` (matchLabels become `=`, matchExpressions keep their
    /// operator), validating it as `metav1.LabelSelectorAsSelector` does.
    pub fn from_k8s(sel: &metav1::LabelSelector) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            reqs.push(new_requirement(
                k.clone(),
                Operator::Equals,
                vec![v.clone()],
            )?);
        }
        for expr in sel.match_expressions.iter().flatten() {
            let op = match expr.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError::InvalidRequirement {
                        key: expr.key.clone(),
                        reason: format!(
                            "{other:?} is not a valid label selector operator (expected In, NotIn, Exists or DoesNotExist)"
                        ),
                    });
                }
            };
            reqs.push(new_requirement(
                expr.key.clone(),
                op,
                expr.values.clone().unwrap_or_default(),
            )?);
        }
        // Stable: for one key, matchLabels come before expressions.
        reqs.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements: reqs })
    }

    /// Convert to a `metav1.LabelSelector` as upstream's `LeaseFromProtobuf` does: `=`/`==` go to
    /// matchLabels, `!=` values are grouped per key into one `NotIn`, the rest become
    /// matchExpressions. A second, different `=` value for a key already in matchLabels becomes an
    /// `In` expression so that the meaning is kept.
    pub fn to_k8s(&self) -> metav1::LabelSelector {
        let mut match_labels = BTreeMap::new();
        let mut expressions = Vec::new();
        let mut not_equals: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for r in &self.requirements {
            let expr = |op: &str, values: Option<Vec<String>>| metav1::LabelSelectorRequirement {
                key: r.key.clone(),
                operator: op.to_string(),
                values,
            };
            match r.operator {
                Operator::Equals => {
                    let value = r.values.first().cloned().unwrap_or_default();
                    match match_labels.get(&r.key) {
                        None => {
                            match_labels.insert(r.key.clone(), value);
                        }
                        Some(existing) if *existing == value => {}
                        Some(_) => expressions.push(expr("In", Some(vec![value]))),
                    }
                }
                Operator::NotEquals => {
                    let values = not_equals.entry(r.key.as_str()).or_default();
                    for v in &r.values {
                        if !values.contains(v) {
                            values.push(v.clone());
                        }
                    }
                }
                Operator::In => expressions.push(expr("In", Some(r.values.clone()))),
                Operator::NotIn => expressions.push(expr("NotIn", Some(r.values.clone()))),
                Operator::Exists => expressions.push(expr("Exists", None)),
                Operator::DoesNotExist => expressions.push(expr("DoesNotExist", None)),
            }
        }
        for (key, mut values) in not_equals {
            values.sort();
            expressions.push(metav1::LabelSelectorRequirement {
                key: key.to_string(),
                operator: "NotIn".to_string(),
                values: Some(values),
            });
        }
        expressions.sort_by(|a, b| a.key.cmp(&b.key));
        metav1::LabelSelector {
            match_labels: (!match_labels.is_empty()).then_some(match_labels),
            match_expressions: (!expressions.is_empty()).then_some(expressions),
        }
    }

    /// Only the `key=value` parts (as the Python client's `extract_match_labels_filter`).
    pub fn match_labels(&self) -> BTreeMap<String, String> {
        self.requirements
            .iter()
            .filter(|r| r.operator == Operator::Equals)
            .filter_map(|r| Some((r.key.clone(), r.values.first()?.clone())))
            .collect()
    }

    /// The selector as a string that [`LabelSelector::parse`] accepts: `""` when empty
    /// (like `labels.Selector.String()`).
    pub fn to_selector_string(&self) -> String {
        self.requirements
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A copy whose keys all get `prefix` (e.g. `metadata.jumpstarter.dev/` for tag filters),
    /// re-validated.
    pub fn with_key_prefix(&self, prefix: &str) -> Result<Self, SelectorError> {
        Self::from_requirements(self.requirements.iter().map(|r| Requirement {
            key: format!("{prefix}{}", r.key),
            operator: r.operator,
            values: r.values.clone(),
        }))
    }
}

/// Canonical form like `metav1.FormatLabelSelector`: requirements sorted by key, joined by `,`;
/// `<none>` when the selector is empty.
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str("<none>");
        }
        f.write_str(&self.to_selector_string())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Validate and normalise one requirement (as `labels.NewRequirement`).
fn new_requirement(
    key: String,
    operator: Operator,
    values: Vec<String>,
) -> Result<Requirement, SelectorError> {
    if let Err(reason) = validate_qualified_name(&key) {
        return Err(SelectorError::InvalidKey { key, reason });
    }
    let count_error = |reason: &str| SelectorError::InvalidRequirement {
        key: key.clone(),
        reason: reason.to_string(),
    };
    let mut values = values;
    match operator {
        Operator::In | Operator::NotIn => {
            if values.is_empty() {
                return Err(count_error(
                    "for 'in' and 'notin' operators, the values set can't be empty",
                ));
            }
            values.sort();
            values.dedup();
        }
        Operator::Equals | Operator::NotEquals => {
            if values.len() != 1 {
                return Err(count_error(
                    "exact-match operators ('=', '==', '!=') need exactly one value",
                ));
            }
        }
        Operator::Exists | Operator::DoesNotExist => {
            if !values.is_empty() {
                return Err(count_error(
                    "values set must be empty for 'exists' and 'does not exist' operators",
                ));
            }
        }
    }
    for v in &values {
        if let Err(reason) = validate_label_value(v) {
            return Err(SelectorError::InvalidValue {
                key,
                value: v.clone(),
                reason,
            });
        }
    }
    Ok(Requirement {
        key,
        operator,
        values,
    })
}

// ---- lexer ----

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    In,
    NotIn,
    Bang,
    NotEquals,
    Equals,
    DoubleEquals,
    Open,
    Close,
    Comma,
    /// `<` or `>`: recognised only to reject them with a clear message.
    Compare(char),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::In => "'in'".into(),
            Tok::NotIn => "'notin'".into(),
            Tok::Bang => "'!'".into(),
            Tok::NotEquals => "'!='".into(),
            Tok::Equals => "'='".into(),
            Tok::DoubleEquals => "'=='".into(),
            Tok::Open => "'('".into(),
            Tok::Close => "')'".into(),
            Tok::Comma => "','".into(),
            Tok::Compare(c) => format!("'{c}'"),
            Tok::End => "end of string".into(),
        }
    }

    /// In value position the keywords are plain identifiers (`a=in` is valid).
    fn as_value(&self) -> Option<String> {
        match self {
            Tok::Ident(s) => Some(s.clone()),
            Tok::In => Some("in".into()),
            Tok::NotIn => Some("notin".into()),
            _ => None,
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '<' | '>')
}

fn lex(s: &str) -> Result<Vec<(usize, Tok)>, SelectorError> {
    let mut out = Vec::new();
    let mut chars = s.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if is_special(c) {
            chars.next();
            let next_is_eq = chars.peek().is_some_and(|&(_, n)| n == '=');
            let tok = match c {
                '!' if next_is_eq => {
                    chars.next();
                    Tok::NotEquals
                }
                '!' => Tok::Bang,
                '=' if next_is_eq => {
                    chars.next();
                    Tok::DoubleEquals
                }
                '=' => Tok::Equals,
                '(' => Tok::Open,
                ')' => Tok::Close,
                ',' => Tok::Comma,
                other => Tok::Compare(other),
            };
            out.push((i, tok));
            continue;
        }
        let mut ident = String::new();
        while let Some(&(_, c)) = chars.peek() {
            if c.is_whitespace() || is_special(c) {
                break;
            }
            ident.push(c);
            chars.next();
        }
        let tok = match ident.as_str() {
            "in" => Tok::In,
            "notin" => Tok::NotIn,
            _ => Tok::Ident(ident),
        };
        out.push((i, tok));
    }
    out.push((s.len(), Tok::End));
    Ok(out)
}

// ---- parser ----

struct Parser<'a> {
    selector: &'a str,
    tokens: Vec<(usize, Tok)>,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        self.tokens.get(self.pos).map_or(&Tok::End, |(_, t)| t)
    }

    fn offset(&self) -> usize {
        self.tokens
            .get(self.pos)
            .map_or(self.selector.len(), |(o, _)| *o)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn error(&self, message: String) -> SelectorError {
        SelectorError::Syntax {
            selector: self.selector.to_string(),
            position: self.offset(),
            message,
        }
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        if *self.peek() == Tok::End {
            return Ok(reqs);
        }
        loop {
            match self.peek() {
                Tok::Ident(_) | Tok::Bang => reqs.push(self.requirement()?),
                other => {
                    let msg = if reqs.is_empty() {
                        format!(
                            "found {}, expected: '!', identifier, or end of string",
                            other.describe()
                        )
                    } else {
                        format!("found {}, expected: identifier after ','", other.describe())
                    };
                    return Err(self.error(msg));
                }
            }
            match self.peek() {
                Tok::End => return Ok(reqs),
                Tok::Comma => {
                    self.next();
                }
                other => {
                    return Err(self.error(format!(
                        "found {}, expected: ',' or end of string",
                        other.describe()
                    )));
                }
            }
        }
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        match self.peek().clone() {
            Tok::Ident(k) => {
                if let Err(reason) = validate_qualified_name(&k) {
                    return Err(SelectorError::InvalidKey { key: k, reason });
                }
                self.next();
                Ok(k)
            }
            other => Err(self.error(format!(
                "found {}, expected: identifier (a label key)",
                other.describe()
            ))),
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        if *self.peek() == Tok::Bang {
            self.next();
            let key = self.key()?;
            return new_requirement(key, Operator::DoesNotExist, Vec::new());
        }
        let key = self.key()?;
        let op_tok = self.peek().clone();
        match op_tok {
            Tok::End | Tok::Comma => new_requirement(key, Operator::Exists, Vec::new()),
            Tok::Equals | Tok::DoubleEquals | Tok::NotEquals => {
                self.next();
                let value = self.exact_value(&key, &op_tok)?;
                let op = if op_tok == Tok::NotEquals {
                    Operator::NotEquals
                } else {
                    Operator::Equals
                };
                new_requirement(key, op, vec![value])
            }
            Tok::In | Tok::NotIn => {
                self.next();
                let values = self.value_list(&key, &op_tok)?;
                let op = if op_tok == Tok::In {
                    Operator::In
                } else {
                    Operator::NotIn
                };
                new_requirement(key, op, values)
            }
            Tok::Compare(c) => Err(self.error(format!(
                "operator '{c}' after key {key:?} is not supported in label selectors \
                 (use =, ==, !=, in, notin)"
            ))),
            other => Err(self.error(format!(
                "found {} after key {key:?}, expected an operator: =, ==, !=, in, notin, ',' or end of string",
                other.describe()
            ))),
        }
    }

    fn exact_value(&mut self, key: &str, op: &Tok) -> Result<String, SelectorError> {
        let t = self.peek().clone();
        if matches!(t, Tok::End | Tok::Comma) {
            return Ok(String::new());
        }
        match t.as_value() {
            Some(v) => {
                self.next();
                Ok(v)
            }
            None => Err(self.error(format!(
                "found {} after {} for key {key:?}, expected: a value",
                t.describe(),
                op.describe()
            ))),
        }
    }

    fn value_list(&mut self, key: &str, op: &Tok) -> Result<Vec<String>, SelectorError> {
        let t = self.peek().clone();
        if t != Tok::Open {
            return Err(self.error(format!(
                "found {} after {} for key {key:?}, expected: '(' starting a value list",
                t.describe(),
                op.describe()
            )));
        }
        self.next();
        // A list of possibly-empty values separated by ',' and closed by ')'.
        let mut values = Vec::new();
        let mut current: Option<String> = None;
        loop {
            let t = self.peek().clone();
            match t {
                Tok::Close => {
                    self.next();
                    values.push(current.take().unwrap_or_default());
                    return Ok(values);
                }
                Tok::Comma => {
                    self.next();
                    values.push(current.take().unwrap_or_default());
                }
                Tok::End => {
                    return Err(self.error(format!(
                        "unbalanced parentheses: value list for key {key:?} is not closed with ')'"
                    )));
                }
                other => match other.as_value() {
                    Some(v) if current.is_none() => {
                        self.next();
                        current = Some(v);
                    }
                    Some(_) => {
                        return Err(self.error(format!(
                            "found {} in value list for key {key:?}, expected: ',' or ')'",
                            other.describe()
                        )));
                    }
                    None => {
                        return Err(self.error(format!(
                            "found {} in value list for key {key:?}, expected: ',', ')' or a value",
                            other.describe()
                        )));
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, operator: Operator, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn parses_every_operator() {
        let s = LabelSelector::parse(
            "z=1, y==2,x!=3,w in (b, a,a),v notin (c),u,!t,example.com/board=rpi-4",
        )
        .unwrap();
        assert_eq!(
            s.requirements(),
            &[
                req("example.com/board", Operator::Equals, &["rpi-4"]),
                req("t", Operator::DoesNotExist, &[]),
                req("u", Operator::Exists, &[]),
                req("v", Operator::NotIn, &["c"]),
                req("w", Operator::In, &["a", "b"]),
                req("x", Operator::NotEquals, &["3"]),
                req("y", Operator::Equals, &["2"]),
                req("z", Operator::Equals, &["1"]),
            ]
        );
        assert_eq!(
            s.to_string(),
            "example.com/board=rpi-4,!t,u,v notin (c),w in (a,b),x!=3,y=2,z=1"
        );
        // The canonical string parses back to the same selector.
        assert_eq!(LabelSelector::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn empty_selects_everything() {
        for s in ["", "   "] {
            let sel = LabelSelector::parse(s).unwrap();
            assert!(sel.is_empty());
            assert!(sel.matches(&labels(&[("a", "b")])));
            assert!(sel.matches(&BTreeMap::new()));
            assert_eq!(sel.to_string(), "<none>");
            assert_eq!(sel.to_selector_string(), "");
        }
        assert_eq!(
            LabelSelector::everything(),
            LabelSelector::parse("").unwrap()
        );
    }

    #[test]
    fn empty_values_as_kubernetes() {
        let s = LabelSelector::parse("a=,b in (),c in (x,,y)").unwrap();
        assert_eq!(
            s.requirements(),
            &[
                req("a", Operator::Equals, &[""]),
                req("b", Operator::In, &[""]),
                req("c", Operator::In, &["", "x", "y"]),
            ]
        );
        // Keywords are plain values in value position.
        let s = LabelSelector::parse("a=in,b in (notin)").unwrap();
        assert_eq!(s.requirements()[0].values, vec!["in"]);
        assert_eq!(s.requirements()[1].values, vec!["notin"]);
    }

    #[test]
    fn matching_semantics() {
        let l = labels(&[("board", "rpi4"), ("site", "lab1")]);
        let yes = [
            "board=rpi4",
            "board==rpi4",
            "board!=x",
            "missing!=x",
            "board in (rpi3,rpi4)",
            "board notin (x)",
            "missing notin (x)",
            "board",
            "!missing",
            "board=rpi4,site=lab1",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
        let no = [
            "board=rpi3",
            "board!=rpi4",
            "board in (x)",
            "missing in (x)",
            "board notin (rpi4)",
            "missing",
            "!board",
            "board=rpi4,site=lab2",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
    }

    fn syntax_err(s: &str) -> String {
        match LabelSelector::parse(s) {
            Err(e @ SelectorError::Syntax { .. }) => e.to_string(),
            other => panic!("{s:?}: expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn malformed_selectors() {
        assert!(syntax_err("a in (b").contains("unbalanced parentheses"));
        assert!(syntax_err("a in (b,c").contains("not closed"));
        assert!(syntax_err("a in b)").contains("expected: '('"));
        assert!(syntax_err("a in").contains("found end of string"));
        assert!(syntax_err("a notin").contains("key \"a\""));
        assert!(syntax_err("a)").contains("found ')'"));
        assert!(syntax_err("(a)").contains("found '('"));
        assert!(syntax_err("a=b,").contains("identifier after ','"));
        assert!(syntax_err(",a").contains("found ','"));
        assert!(syntax_err("=b").contains("found '='"));
        assert!(syntax_err("a=b c").contains("expected: ',' or end of string"));
        assert!(syntax_err("a b").contains("after key \"a\""));
        assert!(syntax_err("a in (b c)").contains("expected: ',' or ')'"));
        assert!(syntax_err("a in ((b))").contains("found '('"));
        assert!(syntax_err("!").contains("expected: identifier"));
        assert!(syntax_err("!a=b").contains("expected: ',' or end of string"));
        assert!(syntax_err("a>1").contains("not supported"));
        assert!(syntax_err("a=(").contains("expected: a value"));
        assert!(syntax_err("a=b,,c").contains("identifier after ','"));
        // Position points at the offending token.
        match LabelSelector::parse("abc=d,e f") {
            Err(SelectorError::Syntax { position, .. }) => assert_eq!(position, 8),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn invalid_keys_and_values() {
        let cases = [
            ("-a=b", "name part"),
            ("a-=b", "name part"),
            ("a/b/c=d", "qualified name"),
            ("/a=b", "prefix part must be non-empty"),
            ("a/=b", "name part must be non-empty"),
            ("Example.COM/a=b", "prefix part"),
            ("a_b.c=d$", "valid label value"),
            ("a=-b", "valid label value"),
            ("a in (ok,-bad)", "\"-bad\""),
            ("é=b", "name part"),
        ];
        for (s, needle) in cases {
            let e = LabelSelector::parse(s).expect_err(s).to_string();
            assert!(e.contains(needle), "{s}: {e}");
        }
        let long = "a".repeat(64);
        let e = LabelSelector::parse(&format!("{long}=b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no more than 63"), "{e}");
        let e = LabelSelector::parse(&format!("a={long}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no more than 63") && e.contains("key \"a\""),
            "{e}"
        );
        assert!(LabelSelector::parse(&format!("{}=b", "a".repeat(63))).is_ok());
        assert!(LabelSelector::parse("jumpstarter.dev/lease-ended").is_ok());
        assert!(LabelSelector::parse("a.B_c-9=X.y_Z-0").is_ok());
    }

    #[test]
    fn to_k8s_groups_not_equals_and_keeps_meaning() {
        let s = LabelSelector::parse("a=1,b!=2,b!=3,c in (x),d,!e,f==4,a=5").unwrap();
        let k = s.to_k8s();
        assert_eq!(k.match_labels, Some(labels(&[("a", "1"), ("f", "4")])));
        let exprs: Vec<(String, String, Option<Vec<String>>)> = k
            .match_expressions
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| (e.key, e.operator, e.values))
            .collect();
        let v = |xs: &[&str]| Some(xs.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        assert_eq!(
            exprs,
            vec![
                ("a".into(), "In".into(), v(&["5"])),
                ("b".into(), "NotIn".into(), v(&["2", "3"])),
                ("c".into(), "In".into(), v(&["x"])),
                ("d".into(), "Exists".into(), None),
                ("e".into(), "DoesNotExist".into(), None),
            ]
        );
        // Round trip through k8s keeps matching behaviour.
        let back = LabelSelector::from_k8s(&k).unwrap();
        for l in [
            labels(&[("a", "1"), ("c", "x"), ("d", ""), ("f", "4")]),
            labels(&[("a", "5"), ("c", "x"), ("d", ""), ("f", "4")]),
            labels(&[("a", "1"), ("b", "2"), ("c", "x"), ("d", ""), ("f", "4")]),
        ] {
            assert_eq!(back.matches(&l), s.matches(&l));
        }
        assert_eq!(
            back.to_string(),
            "a=1,a in (5),b notin (2,3),c in (x),d,!e,f=4"
        );
        assert_eq!(
            LabelSelector::everything().to_k8s(),
            metav1::LabelSelector::default()
        );
        assert_eq!(
            s.match_labels(),
            labels(&[("a", "1"), ("a", "5"), ("f", "4")])
        );
    }

    #[test]
    fn from_k8s_rejects_bad_requirements() {
        let bad = |op: &str, values: Option<Vec<String>>| metav1::LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![metav1::LabelSelectorRequirement {
                key: "k".into(),
                operator: op.into(),
                values,
            }]),
        };
        let e = LabelSelector::from_k8s(&bad("Equals", Some(vec!["a".into()]))).unwrap_err();
        assert!(e.to_string().contains("\"Equals\" is not a valid"), "{e}");
        let e = LabelSelector::from_k8s(&bad("In", None)).unwrap_err();
        assert!(e.to_string().contains("can't be empty"), "{e}");
        let e = LabelSelector::from_k8s(&bad("Exists", Some(vec!["a".into()]))).unwrap_err();
        assert!(e.to_string().contains("must be empty"), "{e}");
        let e = LabelSelector::from_k8s(&metav1::LabelSelector {
            match_labels: Some(labels(&[("bad key", "v")])),
            match_expressions: None,
        })
        .unwrap_err();
        assert!(matches!(e, SelectorError::InvalidKey { ref key, .. } if key == "bad key"));
    }

    #[test]
    fn key_prefix() {
        let s = LabelSelector::parse("env=prod,!team").unwrap();
        let p = s.with_key_prefix("metadata.jumpstarter.dev/").unwrap();
        assert_eq!(
            p.to_string(),
            "metadata.jumpstarter.dev/env=prod,!metadata.jumpstarter.dev/team"
        );
        let s = LabelSelector::parse("x/y=1").unwrap();
        assert!(s.with_key_prefix("metadata.jumpstarter.dev/").is_err());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn requirement() -> impl Strategy<Value = Requirement> {
            let key = prop::sample::select(vec!["a", "b", "example.com/c", "d_e.f"]);
            let value = prop::sample::select(vec!["", "x", "y", "in", "Z-9"]);
            let op = prop::sample::select(vec![
                Operator::Equals,
                Operator::NotEquals,
                Operator::In,
                Operator::NotIn,
                Operator::Exists,
                Operator::DoesNotExist,
            ]);
            (key, op, prop::collection::vec(value, 1..3)).prop_map(|(k, op, vs)| {
                let values: Vec<String> = match op {
                    Operator::Exists | Operator::DoesNotExist => vec![],
                    Operator::Equals | Operator::NotEquals => vec![vs[0].to_string()],
                    _ => vs.iter().map(|v| v.to_string()).collect(),
                };
                Requirement {
                    key: k.to_string(),
                    operator: op,
                    values,
                }
            })
        }

        fn label_set() -> impl Strategy<Value = BTreeMap<String, String>> {
            prop::collection::btree_map(
                prop::sample::select(vec!["a", "b", "example.com/c", "d_e.f"])
                    .prop_map(String::from),
                prop::sample::select(vec!["", "x", "y", "in", "Z-9"]).prop_map(String::from),
                0..4,
            )
        }

        proptest! {
            #[test]
            fn string_and_k8s_forms_keep_meaning(
                reqs in prop::collection::vec(requirement(), 0..5),
                sets in prop::collection::vec(label_set(), 1..8),
            ) {
                let sel = LabelSelector::from_requirements(reqs).unwrap();
                let reparsed = LabelSelector::parse(&sel.to_selector_string()).unwrap();
                prop_assert_eq!(&reparsed, &sel);
                let via_k8s = LabelSelector::from_k8s(&sel.to_k8s()).unwrap();
                for l in &sets {
                    prop_assert_eq!(via_k8s.matches(l), sel.matches(l));
                }
            }

            #[test]
            fn arbitrary_input_never_panics(s in "[a-z=!(), ]{0,20}") {
                // Either a selector whose canonical form parses back, or an error.
                if let Ok(sel) = LabelSelector::parse(&s) {
                    prop_assert_eq!(LabelSelector::parse(&sel.to_selector_string()).unwrap(), sel);
                }
            }
        }
    }
}
