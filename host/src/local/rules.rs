//! `rules:if` expressions: `$VAR`, strings, `/regex/flags`, `null`, `==`, `!=`, `=~`, `!~`,
//! `&&`, `||` and parentheses, evaluated the way GitLab does (an undefined variable is null;
//! a bare variable is true when defined and non-empty).
//!
//! Owns the expression language only; which variables a job sees is the parent module's.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Var(String),
    Str(String),
    Regex(String, String),
    Null,
    Eq,
    Ne,
    Match,
    NoMatch,
    And,
    Or,
    Open,
    Close,
}

fn tokenize(expr: &str) -> Result<Vec<Token>, RuleError> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\n' => i += 1,
            '$' => {
                let braced = chars.get(i + 1) == Some(&'{');
                let start = if braced { i + 2 } else { i + 1 };
                let mut end = start;
                while end < chars.len() && (chars[end].is_ascii_alphanumeric() || chars[end] == '_') {
                    end += 1;
                }
                if end == start {
                    return Err(RuleError(format!("expected a variable name after `$` at position {i}")));
                }
                tokens.push(Token::Var(chars[start..end].iter().collect()));
                i = if braced { end + 1 } else { end };
            }
            '"' | '\'' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&x| x == c)
                    .ok_or_else(|| RuleError(format!("unterminated string at position {i}")))?;
                tokens.push(Token::Str(chars[i + 1..i + 1 + end].iter().collect()));
                i += end + 2;
            }
            '/' => {
                let mut j = i + 1;
                let mut pattern = String::new();
                while j < chars.len() && chars[j] != '/' {
                    if chars[j] == '\\' && j + 1 < chars.len() && chars[j + 1] == '/' {
                        pattern.push('/');
                        j += 2;
                        continue;
                    }
                    pattern.push(chars[j]);
                    j += 1;
                }
                if j >= chars.len() {
                    return Err(RuleError(format!("unterminated regex at position {i}")));
                }
                let mut k = j + 1;
                while k < chars.len() && chars[k].is_ascii_alphabetic() {
                    k += 1;
                }
                tokens.push(Token::Regex(pattern, chars[j + 1..k].iter().collect()));
                i = k;
            }
            '=' | '!' => {
                let next = chars.get(i + 1).copied();
                tokens.push(match (c, next) {
                    ('=', Some('=')) => Token::Eq,
                    ('!', Some('=')) => Token::Ne,
                    ('=', Some('~')) => Token::Match,
                    ('!', Some('~')) => Token::NoMatch,
                    _ => return Err(RuleError(format!("unknown operator at position {i}"))),
                });
                i += 2;
            }
            '&' if chars.get(i + 1) == Some(&'&') => {
                tokens.push(Token::And);
                i += 2;
            }
            '|' if chars.get(i + 1) == Some(&'|') => {
                tokens.push(Token::Or);
                i += 2;
            }
            '(' => {
                tokens.push(Token::Open);
                i += 1;
            }
            ')' => {
                tokens.push(Token::Close);
                i += 1;
            }
            _ if expr[char_offset(expr, i)..].starts_with("null") => {
                tokens.push(Token::Null);
                i += 4;
            }
            _ => return Err(RuleError(format!("unexpected `{c}` at position {i}"))),
        }
    }
    Ok(tokens)
}

fn char_offset(s: &str, chars: usize) -> usize {
    s.char_indices().nth(chars).map(|(b, _)| b).unwrap_or(s.len())
}

#[derive(Debug, Clone)]
enum Value {
    Str(Option<String>),
    Regex(String, String),
}

struct Parser<'a> {
    tokens: Vec<Token>,
    pos: usize,
    vars: &'a BTreeMap<String, String>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }
    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }
    fn or(&mut self) -> Result<bool, RuleError> {
        let mut value = self.and()?;
        while self.peek() == Some(&Token::Or) {
            self.pos += 1;
            let rhs = self.and()?;
            value = value || rhs;
        }
        Ok(value)
    }
    fn and(&mut self) -> Result<bool, RuleError> {
        let mut value = self.comparison()?;
        while self.peek() == Some(&Token::And) {
            self.pos += 1;
            let rhs = self.comparison()?;
            value = value && rhs;
        }
        Ok(value)
    }
    fn operand(&mut self) -> Result<Value, RuleError> {
        match self.next() {
            Some(Token::Var(name)) => Ok(Value::Str(self.vars.get(&name).cloned())),
            Some(Token::Str(s)) => Ok(Value::Str(Some(s))),
            Some(Token::Null) => Ok(Value::Str(None)),
            Some(Token::Regex(p, f)) => Ok(Value::Regex(p, f)),
            other => Err(RuleError(format!("expected a value, found {other:?}"))),
        }
    }
    fn comparison(&mut self) -> Result<bool, RuleError> {
        if self.peek() == Some(&Token::Open) {
            self.pos += 1;
            let value = self.or()?;
            if self.next() != Some(Token::Close) {
                return Err(RuleError("missing `)`".into()));
            }
            return Ok(value);
        }
        let left = self.operand()?;
        let op = match self.peek() {
            Some(Token::Eq | Token::Ne | Token::Match | Token::NoMatch) => self.next(),
            _ => None,
        };
        let Some(op) = op else {
            return Ok(matches!(left, Value::Str(Some(ref s)) if !s.is_empty()));
        };
        let right = self.operand()?;
        match op {
            Token::Eq | Token::Ne => {
                let equal = match (&left, &right) {
                    (Value::Str(a), Value::Str(b)) => a == b,
                    _ => false,
                };
                Ok(if op == Token::Eq { equal } else { !equal })
            }
            _ => {
                let text = match left {
                    Value::Str(s) => s,
                    Value::Regex(..) => return Err(RuleError("the left side of =~ must be a string".into())),
                };
                let (pattern, flags) = match right {
                    Value::Regex(p, f) => (p, f),
                    // A variable holding "/pattern/flags".
                    Value::Str(Some(s)) if s.starts_with('/') && s.len() > 1 => {
                        let end = s.rfind('/').unwrap_or(0);
                        (s[1..end.max(1)].to_string(), s[end + 1..].to_string())
                    }
                    Value::Str(_) => return Err(RuleError("the right side of =~ must be a /regex/".into())),
                };
                let pattern = if flags.contains('i') { format!("(?i){pattern}") } else { pattern };
                let re = regex::Regex::new(&pattern).map_err(|e| RuleError(format!("invalid regex: {e}")))?;
                let matched = text.as_deref().is_some_and(|t| re.is_match(t));
                Ok(if op == Token::Match { matched } else { !matched })
            }
        }
    }
}

/// A `rules:if` expression that does not parse or evaluate; the message says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

/// Evaluate `expr` against `vars`.
pub fn evaluate(expr: &str, vars: &BTreeMap<String, String>) -> Result<bool, RuleError> {
    let tokens = tokenize(expr)?;
    let mut parser = Parser { tokens, pos: 0, vars };
    let value = parser.or()?;
    if parser.pos != parser.tokens.len() {
        return Err(RuleError(format!("unexpected {:?}", parser.tokens[parser.pos])));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("BRANCH".into(), "main".into()),
            ("EMPTY".into(), String::new()),
            ("RE".into(), "/^ma/".into()),
        ])
    }

    #[test]
    fn gitlab_expressions() {
        let v = vars();
        for (expr, want) in [
            ("$BRANCH == \"main\"", true),
            ("$BRANCH != 'main'", false),
            ("$BRANCH =~ /^MA/i", true),
            ("$BRANCH !~ /^dev/", true),
            ("$BRANCH =~ $RE", true),
            ("$MISSING == null", true),
            ("$EMPTY", false),
            ("$BRANCH", true),
            ("$MISSING || ($BRANCH == \"main\" && $EMPTY == \"\")", true),
            ("$BRANCH == \"dev\" || $BRANCH == \"x\"", false),
        ] {
            assert_eq!(evaluate(expr, &v), Ok(want), "{expr}");
        }
        assert!(evaluate("$BRANCH = \"main\"", &v).is_err());
        assert!(evaluate("($BRANCH", &v).is_err());
    }
}
