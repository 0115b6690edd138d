"""Unit tests of agentic_rl.tools.calculator: the whitelisted AST evaluator and `CalculatorTool`."""

from __future__ import annotations

import pytest

from agentic_rl.errors import AgenticRLError, ToolError
from agentic_rl.tools.base import Tool
from agentic_rl.tools.calculator import (
    MAX_EXPRESSION_CHARS,
    MAX_RESULT_DIGITS,
    CalculatorTool,
    evaluate_expression,
)

# --------------------------------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2 + 3", "5"),
        ("(16 - 3 - 4) * 2", "18"),
        ("7 - 10", "-3"),
        ("-5 + +2", "-3"),
        ("--4", "4"),
        ("17 * 23", "391"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** 3 ** 2", "512"),
        ("  42  ", "42"),
        ("0", "0"),
    ],
)
def test_calculator_evaluates_integer_arithmetic(expression, expected):
    assert evaluate_expression(expression) == expected


def test_calculator_keeps_large_integers_exact():
    assert evaluate_expression("123456789 * 987654321") == "121932631112635269"
    assert evaluate_expression("2 ** 64") == "18446744073709551616"
    assert evaluate_expression("10 ** 30 + 1") == "1" + "0" * 29 + "1"


def test_calculator_accepts_a_result_with_many_digits_below_the_limit():
    result = evaluate_expression("10 ** 200 * 10 ** 150")
    assert result == "1" + "0" * 350


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("10 / 4", "2.5"),
        ("7 / 7", "1"),
        ("6 / 3", "2"),
        ("1 / 3", "0.3333333333"),
        ("2 / 3", "0.6666666667"),
        ("0.1 + 0.2", "0.3"),
        ("2 ** 0.5", "1.414213562"),
        ("4 ** 0.5", "2"),
        ("2 ** -1", "0.5"),
        ("1.5 * 2", "3"),
        ("-2.5 * 2", "-5"),
        ("1e20 / 1", "1e+20"),
        ("1e-7 * 1", "1e-07"),
        ("10 ** -400", "0"),
        ("7.5 // 2", "3"),
    ],
)
def test_calculator_formats_floats_to_ten_significant_digits(expression, expected):
    assert evaluate_expression(expression) == expected


def test_calculator_writes_integral_floats_below_1e15_as_integers():
    assert evaluate_expression("999999999999999.0 * 1") == "999999999999999"
    assert evaluate_expression("1e15 * 1") == "1e+15"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("2 ^ 10", "1024"), ("3^2", "9"), ("2^0.5", "1.414213562"), ("(1+1)^3^2", "512")],
)
def test_calculator_reads_caret_as_power(expression, expected):
    assert evaluate_expression(expression) == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1,000 + 1", "1001"),
        ("$1,234,567 * 2", "2469134"),
        ("$5 + $2.50", "7.5"),
        ("1,000,000 / 1,000", "1000"),
    ],
)
def test_calculator_strips_commas_and_dollar_signs(expression, expected):
    assert evaluate_expression(expression) == expected


def test_calculator_reads_times_and_divide_signs():
    assert evaluate_expression("6 × 7") == "42"
    assert evaluate_expression("9 ÷ 2") == "4.5"


def test_calculator_accepts_deep_parentheses_within_the_length_limit():
    depth = (MAX_EXPRESSION_CHARS - 1) // 2
    expression = "(" * depth + "7" + ")" * depth
    assert len(expression) <= MAX_EXPRESSION_CHARS
    assert evaluate_expression(expression) == "7"


# --------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "expression",
    [
        "x",
        "x + 1",
        "pi * 2",
        "__builtins__",
        "(1).real",
        "abs(-3)",
        "__import__('os')",
        "__import__('os').system('echo pwned')",
        "().__class__.__bases__[0].__subclasses__()",
        "lambda: 1",
        "(lambda x: x)(1)",
        "[x for x in range(3)]",
        "{x: 1 for x in range(3)}",
        "(x for x in range(3))",
        "'a' * 3",
        '"abc"',
        "b'a'",
        "True + 1",
        "None",
        "1j",
        "[1, 2]",
        "(1, 2)",
        "{1}",
        "1 < 2",
        "1 and 2",
        "not 1",
        "~1",
        "1 << 3",
        "6 & 3",
        "6 | 3",
        "6 @ 3",
        "1 if 1 else 2",
        "...",
        "x := 3",
        "f'{1}'",
        "[1][0]",
    ],
)
def test_calculator_refuses_anything_but_numbers_and_arithmetic(expression):
    with pytest.raises(ToolError):
        evaluate_expression(expression)


@pytest.mark.parametrize("expression", ["1 +", "(1 + 2", "2 ** ", "1 2", "import os", "1; 2", "a = 1", "\x00"])
def test_calculator_refuses_syntax_errors(expression):
    with pytest.raises(ToolError, match="not a valid arithmetic expression"):
        evaluate_expression(expression)


def test_calculator_refuses_import_call_without_running_it(monkeypatch):
    import builtins

    called = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):
        if name == "os":
            called.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    with pytest.raises(ToolError, match="not allowed"):
        evaluate_expression("__import__('os')")
    assert called == []


@pytest.mark.parametrize(
    "expression",
    [
        "9**9**9**9",
        "9^9^9^9",
        "99999999**99999999",
        "(10**100)**(10**100)",
        "10 ** 401",
        "10 ** 1e308",
        "1.5 ** 100000",
        "(-10) ** 1000",
    ],
)
def test_calculator_refuses_huge_powers_before_computing(expression):
    with pytest.raises(ToolError, match="too large|cannot compute|not a finite"):
        evaluate_expression(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "10**99 * 10**99 * 10**99 * 10**99 * 10**99",
        "*".join(["9**99"] * 10),
        "*".join(["(10**90)"] * 10),
    ],
)
def test_calculator_refuses_huge_multiplication_chains(expression):
    assert len(expression) <= MAX_EXPRESSION_CHARS
    with pytest.raises(ToolError, match="too large"):
        evaluate_expression(expression)


def test_calculator_refuses_result_of_more_than_max_digits():
    assert MAX_RESULT_DIGITS == 400
    with pytest.raises(ToolError, match="more than 400 digits"):
        evaluate_expression("10**200 * 10**200 * 10")


def test_calculator_accepts_power_with_fewer_than_max_digits():
    result = evaluate_expression("2 ** 1000")
    assert len(result) == 302
    assert result == str(2**1000)


@pytest.mark.parametrize("expression", ["1e308 * 10", "1e308 + 1e308", "1e999", "-1e999 + 1", "10**399 * 1.0"])
def test_calculator_refuses_non_finite_or_overflowing_floats(expression):
    with pytest.raises(ToolError):
        evaluate_expression(expression)


def test_calculator_refuses_very_long_input():
    expression = "1+" * 200 + "1"
    with pytest.raises(ToolError, match="too long"):
        evaluate_expression(expression)


def test_calculator_accepts_input_of_exactly_the_maximum_length():
    expression = " " * (MAX_EXPRESSION_CHARS - 1) + "5"
    assert len(expression) == MAX_EXPRESSION_CHARS
    assert evaluate_expression(expression) == "5"


def test_calculator_refuses_input_one_past_the_maximum_length():
    expression = " " * MAX_EXPRESSION_CHARS + "5"
    with pytest.raises(ToolError, match=f"at most {MAX_EXPRESSION_CHARS}"):
        evaluate_expression(expression)


@pytest.mark.parametrize("expression", ["-" * 200 + "1", "+-" * 100 + "1", "(((" * 10 + "1+" * 60 + "1" + ")))" * 10])
def test_calculator_refuses_deeply_nested_or_too_complex_expressions(expression):
    assert len(expression) <= MAX_EXPRESSION_CHARS
    with pytest.raises(ToolError, match="too complex"):
        evaluate_expression(expression)


@pytest.mark.parametrize("expression", ["1 / 0", "1 // 0", "5 % 0", "1.0 / 0.0", "0 ** -1", "0.0 ** -2", "2 / (3 - 3)"])
def test_calculator_refuses_division_by_zero(expression):
    with pytest.raises(ToolError, match="division by zero"):
        evaluate_expression(expression)


@pytest.mark.parametrize("expression", ["(-8) ** (1/3)", "(-1) ** 0.5", "(-2) ^ 0.5"])
def test_calculator_refuses_complex_results(expression):
    with pytest.raises(ToolError, match="not a real number"):
        evaluate_expression(expression)


@pytest.mark.parametrize("value", [None, 42, 4.2, ["1+1"], {"expression": "1"}, b"1+1"])
def test_calculator_refuses_non_string_argument(value):
    with pytest.raises(ToolError, match="non-empty string"):
        evaluate_expression(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", "   ", "\n\t"])
def test_calculator_refuses_empty_expression(value):
    with pytest.raises(ToolError, match="non-empty string"):
        evaluate_expression(value)


def test_calculator_error_is_an_agentic_rl_error():
    with pytest.raises(AgenticRLError):
        evaluate_expression("x")


# --------------------------------------------------------------------------------------------------- the tool


def test_calculator_tool_executes_expression_argument():
    assert CalculatorTool().execute({"expression": "(16 - 3 - 4) * 2"}) == "18"


def test_calculator_tool_ignores_extra_arguments():
    assert CalculatorTool().execute({"expression": "2^5", "unit": "apples"}) == "32"


@pytest.mark.parametrize("arguments", [{}, {"expr": "1+1"}, {"expression": 3}, {"expression": None}])
def test_calculator_tool_refuses_missing_or_non_string_expression(arguments):
    with pytest.raises(ToolError, match="expression"):
        CalculatorTool().execute(arguments)


def test_calculator_tool_passes_evaluation_errors_through():
    with pytest.raises(ToolError, match="division by zero"):
        CalculatorTool().execute({"expression": "1/0"})


def test_calculator_tool_schema_is_an_openai_function_schema():
    tool = CalculatorTool()
    assert isinstance(tool, Tool)
    schema = tool.schema
    assert schema["type"] == "function"
    assert set(schema) == {"type", "function"}
    function = schema["function"]
    assert set(function) == {"name", "description", "parameters"}
    assert function["name"] == "calculator" == tool.name
    assert isinstance(function["description"], str) and function["description"]
    assert function["parameters"]["type"] == "object"
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"


def test_calculator_tool_has_a_positive_timeout():
    assert CalculatorTool.timeout_s > 0
