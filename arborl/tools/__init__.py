"""arborl.tools: the Tool contract, tools from typed functions, call formats, calculator, MCP."""

from arborl.tools.base import ErrorResult, StatefulTool, Tool, truncate
from arborl.tools.calculator import CALCULATOR, CalculatorError, calculator
from arborl.tools.formats import FORMATS, CallFormat, HermesFormat, ParsedCall, ParsedTurn, SearchR1Format
from arborl.tools.function import FunctionTool, tool

__all__ = [
    "CALCULATOR", "FORMATS", "CalculatorError", "CallFormat", "ErrorResult", "FunctionTool", "HermesFormat",
    "ParsedCall", "ParsedTurn", "SearchR1Format", "StatefulTool", "Tool", "calculator", "tool", "truncate",
]
