"""arborl.tools: the Tool contract, tools from typed functions, call formats, calculator, MCP.

The MCP adapter imports the ``mcp`` SDK only when a connection is made (extra ``arborl[mcp]``).
"""

from arborl.tools.base import ErrorResult, StatefulTool, Tool, truncate
from arborl.tools.calculator import CALCULATOR, CalculatorError, calculator
from arborl.tools.formats import FORMATS, CallFormat, HermesFormat, ParsedCall, ParsedTurn, SearchR1Format
from arborl.tools.function import FunctionTool, tool
from arborl.tools.mcp_client import MCPError, MCPTool, MCPTools

__all__ = [
    "CALCULATOR", "FORMATS", "CalculatorError", "CallFormat", "ErrorResult", "FunctionTool", "HermesFormat",
    "MCPError", "MCPTool", "MCPTools", "ParsedCall", "ParsedTurn", "SearchR1Format", "StatefulTool", "Tool", "calculator", "tool", "truncate",
]
