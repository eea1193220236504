//! `--node-selector`: which Nodes this controller serves, as a Kubernetes label selector in its
//! string form (`a=b,c!=d,e in (x,y),f notin (z),!g,h`; empty selects every Node).
//!
//! kube-rs represents and matches selectors ([`kube::core::Selector`], [`Expression`],
//! [`SelectorExt::matches`]) but does not parse the string form, so [`NodeSelector::parse`]
//! reads it into kube-rs's expressions following k8s.io/apimachinery's `labels.Parse`
//! (`pkg/labels/selector.go`), whose grammar is:
//!
//! ```text
//! <selector-syntax>         ::= <requirement> | <requirement> "," <selector-syntax>
//! <requirement>             ::= [!] KEY [ <set-based-restriction> | <exact-match-restriction> ]
//! <set-based-restriction>   ::= "" | <inclusion-exclusion> <value-set>
//! <inclusion-exclusion>     ::= "in" | "notin"
//! <value-set>               ::= "(" <values> ")"
//! <values>                  ::= VALUE | VALUE "," <values>
//! <exact-match-restriction> ::= ["=" | "==" | "!="] VALUE
//! ```
//!
//! As there: whitespace between tokens is ignored; a KEY or VALUE is a run of characters other
//! than whitespace and `!=(),<>`; `in`/`notin` are keywords only in operator position; a missing
//! VALUE after `=`/`!=` is the empty value, and `()`, `(,a)`, `(a,)` contain the empty value;
//! keys and values are checked by [`super::validate_key`] and [`super::validate_value`]
//! (apimachinery's `validateLabelKey` and `validateLabelValue`). Matching: every requirement must
//! hold (`!=` and `notin` hold for a Node without the key, as upstream). `labels.Parse` also
//! accepts `key>N` and `key<N`; those are refused here (kube-rs's [`Expression`] and the API's
//! `LabelSelector` have no such operator).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use kube::core::{Expression, Selector, SelectorExt};

use super::{InvalidLabel, key_of, validate_key, validate_value};

/// Why a `--node-selector` value is not a label selector. The message names what was found and
/// what was expected, as apimachinery's parser does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The text does not follow the grammar.
    #[error("found {found}, expected: {expected}")]
    Syntax {
        /// The token found, quoted, or `end of string`.
        found: String,
        /// What the grammar allows there.
        expected: &'static str,
    },
    /// A key is not a qualified name, or a value not a label value ([`super::validate_key`],
    /// [`super::validate_value`]).
    #[error(transparent)]
    Label(#[from] InvalidLabel),
    /// `>` or `<`: accepted by `labels.Parse`, not by this controller.
    #[error("operator {0:?} is not supported (use =, ==, !=, in, notin, KEY or !KEY)")]
    Unsupported(&'static str),
}

/// A parsed `--node-selector`: the Nodes whose labels it matches are served. The default selects
/// every Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSelector {
    selector: Selector,
    /// The label keys the requirements read, sorted, no duplicates.
    keys: Vec<String>,
}

impl NodeSelector {
    /// Parses the string form (see the module documentation for the grammar).
    ///
    /// # Errors
    /// [`SelectorError`] for the first token, key or value that breaks a rule.
    pub fn parse(text: &str) -> Result<NodeSelector, SelectorError> {
        let expressions = Parser::new(text).selector()?;
        let keys: BTreeSet<String> = expressions.iter().map(|e| key_of(e).to_owned()).collect();
        Ok(NodeSelector {
            selector: expressions.into_iter().collect(),
            keys: keys.into_iter().collect(),
        })
    }

    /// Whether this selector selects every Node (the empty selector).
    pub fn selects_all(&self) -> bool {
        self.selector.selects_all()
    }

    /// Whether a Node with these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }

    /// The label keys the selector reads, sorted, no duplicates (all a cache needs to keep of a
    /// Node's labels to evaluate it).
    pub fn label_keys(&self) -> &[String] {
        &self.keys
    }
}

/// The canonical string form (kube-rs's rendering; parses back to the same selector).
impl fmt::Display for NodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.selector.fmt(f)
    }
}

impl FromStr for NodeSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<NodeSelector, SelectorError> {
        NodeSelector::parse(text)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token<'a> {
    Ident(&'a str),
    /// `!`
    Not,
    /// `=`
    Equals,
    /// `==`
    DoubleEquals,
    /// `!=`
    NotEquals,
    /// `(`
    Open,
    /// `)`
    Close,
    /// `,`
    Comma,
    /// `>`
    Greater,
    /// `<`
    Less,
    End,
}

impl Token<'_> {
    /// As apimachinery's messages quote it.
    fn describe(&self) -> String {
        let text = match self {
            Token::Ident(text) => text,
            Token::Not => "!",
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::NotEquals => "!=",
            Token::Open => "(",
            Token::Close => ")",
            Token::Comma => ",",
            Token::Greater => ">",
            Token::Less => "<",
            Token::End => return "end of string".to_owned(),
        };
        format!("'{text}'")
    }
}

/// apimachinery's `isWhitespace`.
fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// apimachinery's `isSpecialSymbol`.
fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

struct Parser<'a> {
    rest: &'a str,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser { rest: text }
    }

    /// The next token and the text after it (the longest special symbol, as the lexer's
    /// `scanSpecialSymbol`; `in`/`notin` stay identifiers here: the caller decides by position).
    fn scan(&self) -> (Token<'a>, &'a str) {
        let text = self.rest.trim_start_matches(is_whitespace);
        let mut chars = text.chars();
        let Some(first) = chars.next() else {
            return (Token::End, text);
        };
        if is_special(first) {
            let two = text.get(..2);
            let (token, len) = match (first, two) {
                (_, Some("!=")) => (Token::NotEquals, 2),
                (_, Some("==")) => (Token::DoubleEquals, 2),
                ('!', _) => (Token::Not, 1),
                ('=', _) => (Token::Equals, 1),
                ('(', _) => (Token::Open, 1),
                (')', _) => (Token::Close, 1),
                (',', _) => (Token::Comma, 1),
                ('>', _) => (Token::Greater, 1),
                _ => (Token::Less, 1),
            };
            return (token, &text[len..]);
        }
        let end = text
            .find(|c: char| is_whitespace(c) || is_special(c))
            .unwrap_or(text.len());
        (Token::Ident(&text[..end]), &text[end..])
    }

    fn peek(&self) -> Token<'a> {
        self.scan().0
    }

    fn next(&mut self) -> Token<'a> {
        let (token, rest) = self.scan();
        self.rest = rest;
        token
    }

    fn syntax<T>(found: &Token<'_>, expected: &'static str) -> Result<T, SelectorError> {
        Err(SelectorError::Syntax {
            found: found.describe(),
            expected,
        })
    }

    /// `parse`: requirements separated by commas, up to the end.
    fn selector(&mut self) -> Result<Vec<Expression>, SelectorError> {
        let mut expressions = Vec::new();
        loop {
            match self.peek() {
                Token::End => return Ok(expressions),
                Token::Ident(_) | Token::Not => {}
                other => return Self::syntax(&other, "!, identifier, or 'end of string'"),
            }
            expressions.push(self.requirement()?);
            match self.next() {
                Token::End => return Ok(expressions),
                Token::Comma => match self.peek() {
                    Token::Ident(_) | Token::Not => {}
                    other => return Self::syntax(&other, "identifier after ','"),
                },
                other => return Self::syntax(&other, "',' or 'end of string'"),
            }
        }
    }

    /// `parseRequirement`: `!KEY`, `KEY`, or `KEY` operator value(s).
    fn requirement(&mut self) -> Result<Expression, SelectorError> {
        let negated = self.peek() == Token::Not;
        if negated {
            self.next();
        }
        let key = match self.next() {
            Token::Ident(key) => key.to_owned(),
            other => return Self::syntax(&other, "identifier"),
        };
        validate_key(&key)?;
        if negated {
            return Ok(Expression::DoesNotExist(key));
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(Expression::Exists(key));
        }
        let expression = match self.next() {
            Token::Equals | Token::DoubleEquals => Expression::Equal(key.clone(), self.exact()?),
            Token::NotEquals => Expression::NotEqual(key.clone(), self.exact()?),
            Token::Ident("in") => Expression::In(key.clone(), self.set()?),
            Token::Ident("notin") => Expression::NotIn(key.clone(), self.set()?),
            Token::Greater => return Err(SelectorError::Unsupported(">")),
            Token::Less => return Err(SelectorError::Unsupported("<")),
            other => return Self::syntax(&other, "one of =, ==, !=, in, notin"),
        };
        match &expression {
            Expression::Equal(_, value) | Expression::NotEqual(_, value) => {
                validate_value(&key, value)?;
            }
            Expression::In(_, values) | Expression::NotIn(_, values) => {
                for value in values {
                    validate_value(&key, value)?;
                }
            }
            Expression::Exists(_) | Expression::DoesNotExist(_) => {}
        }
        Ok(expression)
    }

    /// `parseExactValue`: one value, empty at `,` or the end.
    fn exact(&mut self) -> Result<String, SelectorError> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(String::new());
        }
        match self.next() {
            Token::Ident(value) => Ok(value.to_owned()),
            other => Self::syntax(&other, "identifier"),
        }
    }

    /// `parseValues` and `parseIdentifiersList`: `(v1,v2,…)`; empty places are the empty value.
    fn set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        match self.next() {
            Token::Open => {}
            other => return Self::syntax(&other, "'('"),
        }
        let mut values = BTreeSet::new();
        // Whether the last token read inside the parentheses was a comma (or the opening one).
        let mut after_separator = true;
        loop {
            match self.next() {
                Token::Ident(value) if after_separator => {
                    values.insert(value.to_owned());
                    after_separator = false;
                }
                Token::Comma => {
                    if after_separator {
                        values.insert(String::new());
                    }
                    after_separator = true;
                }
                Token::Close => {
                    if after_separator {
                        values.insert(String::new());
                    }
                    return Ok(values);
                }
                other if after_separator => {
                    return Self::syntax(&other, "',', ')' or identifier");
                }
                other => return Self::syntax(&other, "',' or ')'"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parsed(text: &str) -> Vec<Expression> {
        NodeSelector::parse(text)
            .unwrap()
            .selector
            .into_iter()
            .collect()
    }

    fn set(values: &[&str]) -> BTreeSet<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    /// Every form of the grammar, as apimachinery reads it (its `TestToString`/`TestParse` cases).
    #[test]
    fn reads_each_form() {
        use Expression::*;
        assert_eq!(parsed(""), vec![]);
        assert_eq!(parsed("  "), vec![]);
        assert_eq!(
            parsed("x=a,y==b,z!=c"),
            vec![
                Equal("x".into(), "a".into()),
                Equal("y".into(), "b".into()),
                NotEqual("z".into(), "c".into()),
            ]
        );
        assert_eq!(
            parsed("x= ,z= "),
            vec![
                Equal("x".into(), String::new()),
                Equal("z".into(), String::new())
            ]
        );
        assert_eq!(
            parsed("!x, y ,node-role.kubernetes.io/control-plane"),
            vec![
                DoesNotExist("x".into()),
                Exists("y".into()),
                Exists("node-role.kubernetes.io/control-plane".into()),
            ]
        );
        assert_eq!(
            parsed("x in (abc,def),y notin(a)"),
            vec![
                In("x".into(), set(&["abc", "def"])),
                NotIn("y".into(), set(&["a"])),
            ]
        );
        // Empty places in a value set are the empty value.
        assert_eq!(parsed("x in ()"), vec![In("x".into(), set(&[""]))]);
        assert_eq!(parsed("x in (,a)"), vec![In("x".into(), set(&["", "a"]))]);
        assert_eq!(parsed("x in (a,)"), vec![In("x".into(), set(&["", "a"]))]);
        assert_eq!(
            parsed("x in (a,,b)"),
            vec![In("x".into(), set(&["", "a", "b"]))]
        );
        // `in` and `notin` are keywords only as operators.
        assert_eq!(parsed("in=notin"), vec![Equal("in".into(), "notin".into())]);
    }

    /// apimachinery's rejected selectors, and the operators we do not take.
    #[test]
    fn refuses_bad_selectors() {
        // `|` is no token: "a||y" is one value, an invalid one.
        assert!(matches!(
            NodeSelector::parse("x=a||y=b"),
            Err(SelectorError::Label(InvalidLabel::Value { .. }))
        ));
        for text in [
            "x==a==b",
            "!x=a",
            "x in abc",
            "x in (abc",
            "x in (abc def)",
            "x notin",
            ",x=a",
            "x=a,",
            "x=a,,y=b",
            "(x)",
            "x y",
            "x=(a)",
            "x=a b",
        ] {
            assert!(
                matches!(NodeSelector::parse(text), Err(SelectorError::Syntax { .. })),
                "{text}: {:?}",
                NodeSelector::parse(text)
            );
        }
        assert_eq!(
            NodeSelector::parse("x>1"),
            Err(SelectorError::Unsupported(">"))
        );
        assert_eq!(
            NodeSelector::parse("x<1"),
            Err(SelectorError::Unsupported("<"))
        );
        for key in [
            "-x",
            "x-",
            "a/b/c",
            "/x",
            "Example.com/x",
            "example.com/",
            "x@y",
            &"k".repeat(64),
        ] {
            assert!(
                matches!(
                    NodeSelector::parse(&format!("{key}=v")),
                    Err(SelectorError::Label(InvalidLabel::Key { .. }))
                ),
                "{key}"
            );
        }
        for value in ["-v", "v_", "a:b", &"v".repeat(64)] {
            assert!(
                matches!(
                    NodeSelector::parse(&format!("k in ({value})")),
                    Err(SelectorError::Label(InvalidLabel::Value { .. }))
                ),
                "{value}"
            );
        }
        assert_eq!(
            NodeSelector::parse("x in (a").unwrap_err().to_string(),
            "found end of string, expected: ',' or ')'"
        );
    }

    /// Matching follows apimachinery: all requirements hold; `!=` and `notin` hold without the key.
    #[test]
    fn matches_as_upstream() {
        let selector = NodeSelector::parse(
            "pool in (cilium,calico),tier!=edge,!excluded,kubernetes.io/os=linux,zone notin (z9)",
        )
        .unwrap();
        let base = [
            ("pool", "cilium"),
            ("kubernetes.io/os", "linux"),
            ("zone", "z1"),
        ];
        assert!(selector.matches(&labels(&base)));
        assert!(selector.matches(&labels(&[
            ("pool", "calico"),
            ("kubernetes.io/os", "linux")
        ])));
        for (key, value) in [
            ("pool", "other"),
            ("tier", "edge"),
            ("excluded", ""),
            ("kubernetes.io/os", "windows"),
            ("zone", "z9"),
        ] {
            let mut changed = labels(&base);
            changed.insert(key.to_owned(), value.to_owned());
            assert!(!selector.matches(&changed), "{key}={value}");
        }
        assert!(!selector.matches(&BTreeMap::new()));
        assert_eq!(
            selector.label_keys(),
            ["excluded", "kubernetes.io/os", "pool", "tier", "zone"]
        );
        let all = NodeSelector::default();
        assert!(all.selects_all() && all.matches(&BTreeMap::new()));
        assert!(NodeSelector::parse(" ").unwrap().selects_all());
    }

    /// The test values of k8s.io/apimachinery v0.37.0 `pkg/labels/selector_test.go`
    /// (`TestSelectorParse`, `TestSetSelectorParser`, `TestSelectorMatches`,
    /// `TestRequirementSelectorMatching`, `TestRequirementConstructor`'s key and value limits),
    /// each with upstream's verdict: accepted (and the requirements it reads, in input order:
    /// upstream sorts them by key, which changes no match) or refused. `>`/`<` are the one
    /// deliberate difference: upstream accepts them, we refuse them as [`SelectorError::Unsupported`].
    #[test]
    fn apimachinery_selector_test_values() {
        use Expression::*;
        let good: &[(&str, Vec<Expression>)] = &[
            (
                "x=a,y=b,z=c",
                vec![
                    Equal("x".into(), "a".into()),
                    Equal("y".into(), "b".into()),
                    Equal("z".into(), "c".into()),
                ],
            ),
            ("", vec![]),
            (
                "x!=a,y=b",
                vec![
                    NotEqual("x".into(), "a".into()),
                    Equal("y".into(), "b".into()),
                ],
            ),
            ("x=", vec![Equal("x".into(), String::new())]),
            ("x= ", vec![Equal("x".into(), String::new())]),
            (
                "x=,z= ",
                vec![
                    Equal("x".into(), String::new()),
                    Equal("z".into(), String::new()),
                ],
            ),
            ("!x", vec![DoesNotExist("x".into())]),
            ("\rx", vec![Exists("x".into())]),
            (
                "this-is-a-dns.domain.com/key-with-dash",
                vec![Exists("this-is-a-dns.domain.com/key-with-dash".into())],
            ),
            (
                "this-is-another-dns.domain.com/key-with-dash in (so,what)",
                vec![In(
                    "this-is-another-dns.domain.com/key-with-dash".into(),
                    set(&["so", "what"]),
                )],
            ),
            (
                "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
                vec![NotIn(
                    "0.1.2.domain/99".into(),
                    set(&["10.10.100.1", "tick.tack.clock"]),
                )],
            ),
            ("foo  in\t (abc)", vec![In("foo".into(), set(&["abc"]))]),
            ("x notin\n (abc)", vec![NotIn("x".into(), set(&["abc"]))]),
            (
                "x  notin\t\t\t(abc,def)",
                vec![NotIn("x".into(), set(&["abc", "def"]))],
            ),
            ("x in (abc,def)", vec![In("x".into(), set(&["abc", "def"]))]),
            ("x in (abc,)", vec![In("x".into(), set(&["abc", ""]))]),
            ("x in (abc,abc)", vec![In("x".into(), set(&["abc"]))]),
            ("x in ()", vec![In("x".into(), set(&[""]))]),
            ("x in (a,,)", vec![In("x".into(), set(&["a", ""]))]),
            ("x in (a,,,)", vec![In("x".into(), set(&["a", ""]))]),
            ("x in (a,,,,,,)", vec![In("x".into(), set(&["a", ""]))]),
            ("x in (a,,a,,a,,a,,)", vec![In("x".into(), set(&["a", ""]))]),
            (
                "x notin (abc,,def),bar,z in (),w",
                vec![
                    NotIn("x".into(), set(&["abc", "", "def"])),
                    Exists("bar".into()),
                    In("z".into(), set(&[""])),
                    Exists("w".into()),
                ],
            ),
            (
                "x,y in (a)",
                vec![Exists("x".into()), In("y".into(), set(&["a"]))],
            ),
            ("x=a", vec![Equal("x".into(), "a".into())]),
            (
                "x=a,y!=b,z in (h,i,j)",
                vec![
                    Equal("x".into(), "a".into()),
                    NotEqual("y".into(), "b".into()),
                    In("z".into(), set(&["h", "i", "j"])),
                ],
            ),
            ("x notin ( )", vec![NotIn("x".into(), set(&[""]))]),
            ("x notin (, a)", vec![NotIn("x".into(), set(&["", "a"]))]),
            ("a ", vec![Exists("a".into())]),
            (
                "a in (x,y,notin, z,in)",
                vec![In("a".into(), set(&["in", "notin", "x", "y", "z"]))],
            ),
            ("notin=in", vec![Equal("notin".into(), "in".into())]),
            (
                "x=abc,y==jkl,z!=a,z",
                vec![
                    Equal("x".into(), "abc".into()),
                    Equal("y".into(), "jkl".into()),
                    NotEqual("z".into(), "a".into()),
                    Exists("z".into()),
                ],
            ),
        ];
        for (text, want) in good {
            assert_eq!(&parsed(text), want, "{text:?}");
        }
        let bad = [
            "x=a||y=b",
            "x==a==b",
            "!x=a",
            "x,,y",
            ",x,y",
            "x nott in (y)",
            "a in (xyz),",
            "a in (xyz)b notin ()",
            "a in (xyz abc)",
            "a notin(",
            "a (",
            "(",
        ];
        for text in bad {
            assert!(NodeSelector::parse(text).is_err(), "{text:?} accepted");
        }
        for text in ["x>1", "x>1,z<5", "x<a", "x<7"] {
            assert!(
                matches!(
                    NodeSelector::parse(text),
                    Err(SelectorError::Unsupported(_))
                ),
                "{text:?}"
            );
        }
        // TestRequirementConstructor's limits: a key of 254 characters, a value of 254, "a b".
        assert!(matches!(
            NodeSelector::parse(&"a".repeat(254)),
            Err(SelectorError::Label(InvalidLabel::Key { .. }))
        ));
        assert!(matches!(
            NodeSelector::parse(&format!("x16={}", "a".repeat(254))),
            Err(SelectorError::Label(InvalidLabel::Value { .. }))
        ));
        assert!(NodeSelector::parse("x17=a b").is_err());
        // The longest key upstream accepts: a 253-character prefix and a 63-character name.
        let prefix = crate::labels::longest_key_prefix();
        let longest = format!("{prefix}/{}", "n".repeat(63));
        assert_eq!(parsed(&format!("{longest}={}", "v".repeat(63))).len(), 1);
        assert!(NodeSelector::parse(&format!("{prefix}e/n")).is_err());

        // Matching: (selector, labels, upstream's verdict).
        type Labels = &'static [(&'static str, &'static str)];
        let matching: &[(&str, Labels, bool)] = &[
            ("", &[("x", "y")], true),
            ("x=y", &[("x", "y")], true),
            ("x=y,z=w", &[("x", "y"), ("z", "w")], true),
            ("x!=y,z!=w", &[("x", "z"), ("z", "a")], true),
            ("notin=in", &[("notin", "in")], true),
            ("x", &[("x", "z")], true),
            ("!x", &[("y", "z")], true),
            ("x=z", &[], false),
            ("x=y", &[("x", "z")], false),
            ("x=y,z=w", &[("x", "w"), ("z", "w")], false),
            ("x!=y,z!=w", &[("x", "z"), ("z", "w")], false),
            ("x", &[("y", "z")], false),
            ("!x", &[("x", "z")], false),
            ("foo=bar", &[("foo", "bar"), ("baz", "blah")], true),
            ("baz=blah", &[("foo", "bar"), ("baz", "blah")], true),
            ("foo=bar,baz=blah", &[("foo", "bar"), ("baz", "blah")], true),
            ("foo=blah", &[("foo", "bar"), ("baz", "blah")], false),
            ("baz=bar", &[("foo", "bar"), ("baz", "blah")], false),
            (
                "foo=bar,foobar=bar,baz=blah",
                &[("foo", "bar"), ("baz", "blah")],
                false,
            ),
            (
                "x in (foo),y notin (alpha)",
                &[("x", "foo"), ("y", "baz")],
                true,
            ),
            (
                "x in (foo),y in (alpha)",
                &[("x", "foo"), ("y", "baz")],
                false,
            ),
            ("x notin (),y", &[("y", "")], true),
            ("!x,y", &[("y", "")], true),
            ("x notin (),!y", &[("y", "")], false),
            ("x in ()", &[("y", "baz")], false),
            // Duplicate keys: every requirement must hold.
            ("x=a,x=b", &[("x", "a")], false),
            ("x,!x", &[("x", "a")], false),
        ];
        for (text, labels_of, want) in matching {
            let selector = NodeSelector::parse(text).unwrap();
            assert_eq!(
                selector.matches(&labels(labels_of)),
                *want,
                "{text:?} on {labels_of:?}"
            );
        }
    }

    /// Hostile input: what upstream's byte lexer would read as part of an identifier (non-ASCII
    /// space, letters, a NUL) is refused by the key or value rules; a megabyte selector parses or
    /// fails in linear time, without a panic.
    #[test]
    fn hostile_selectors_are_refused_without_panic() {
        for text in [
            "x=\u{a0}a",
            "\u{a0}x",
            "zone=\u{e9}",
            "\u{1F600}",
            "x\u{0}=a",
            "x=a\u{0}",
            "x in (\u{2028})",
            "x=a,\u{3000}",
            "k\u{301}=v",
            "x=\u{ff1d}",
        ] {
            assert!(NodeSelector::parse(text).is_err(), "{text:?}");
        }
        // Multi-byte characters next to special symbols: no slicing inside a character.
        for text in [
            "!\u{e9}",
            "=\u{e9}",
            "x!\u{e9}",
            "x=\u{e9}\u{e9}",
            "(\u{e9}",
            "x in (\u{e9}",
        ] {
            assert!(NodeSelector::parse(text).is_err(), "{text:?}");
        }
        // Huge inputs end (no recursion limit hit, no quadratic blow-up that would stall the
        // suite); how fast is the benches' to measure, not a wall-clock bound's.
        let many = vec!["a=b"; 250_000].join(",");
        assert_eq!(NodeSelector::parse(&many).unwrap().label_keys(), ["a"]);
        let long_value = format!("x in ({})", vec!["v"; 300_000].join(","));
        assert_eq!(parsed(&long_value).len(), 1);
        assert!(NodeSelector::parse(&"(".repeat(1_000_000)).is_err());
        assert!(NodeSelector::parse(&"k".repeat(1_000_000)).is_err());
        assert!(
            NodeSelector::parse(&" ".repeat(1_000_000))
                .unwrap()
                .selects_all()
        );
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,20}[a-zA-Z0-9])?"
    }

    fn key() -> impl Strategy<Value = String> {
        (
            proptest::option::of("[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\\.[a-z0-9]{1,8}){0,2}"),
            name(),
        )
            .prop_map(|(prefix, name)| match prefix {
                Some(prefix) => format!("{prefix}/{name}"),
                None => name,
            })
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), name()]
    }

    fn values() -> impl Strategy<Value = BTreeSet<String>> {
        proptest::collection::btree_set(value(), 1..4)
    }

    fn expression() -> impl Strategy<Value = Expression> {
        prop_oneof![
            (key(), value()).prop_map(|(k, v)| Expression::Equal(k, v)),
            (key(), value()).prop_map(|(k, v)| Expression::NotEqual(k, v)),
            (key(), values()).prop_map(|(k, v)| Expression::In(k, v)),
            (key(), values()).prop_map(|(k, v)| Expression::NotIn(k, v)),
            key().prop_map(Expression::Exists),
            key().prop_map(Expression::DoesNotExist),
        ]
    }

    proptest! {
        /// Any selector kube-rs renders parses back to the same expressions, with or without
        /// whitespace around the tokens.
        #[test]
        fn rendered_selectors_parse_back(expressions in proptest::collection::vec(expression(), 0..5)) {
            let selector: Selector = expressions.iter().cloned().collect();
            let text = selector.to_string();
            prop_assert_eq!(parsed(&text), expressions.clone());
            let spaced = text
                .replace(',', " , ")
                .replace("!=", " != ")
                .replace('(', " ( ")
                .replace(')', " ) ");
            prop_assert_eq!(parsed(&spaced), expressions);
        }

        /// Parsing never panics, and what it accepts renders to text that parses the same.
        #[test]
        fn any_text_parses_or_errs(text in "[a-z=!(), <>in]{0,24}") {
            if let Ok(selector) = NodeSelector::parse(&text) {
                prop_assert_eq!(NodeSelector::parse(&selector.to_string()), Ok(selector));
            }
        }
    }
}
