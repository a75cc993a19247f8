"""Text a page (or a poison message) can put into errors, titles and URLs, aimed at terminals.

Rich markup (``[/]`` crashes a command that prints it as markup, ``[link=…]`` spoofs a link) and
escape sequences (an OSC 8 hyperlink, a screen clear). The link targets are a blocked loopback
address: nothing here is ever fetched.
"""

HOSTILE = ("[/] [link=http://127.0.0.9/]click me[/link] [bold red]FAKE[/] "
           "\x1b]8;;http://127.0.0.9/\x1b\\hidden link\x1b]8;;\x1b\\ \x1b[2J\x9b31m end")


def shown_safely(output: str) -> bool:
    """Whether ``output`` shows the hostile text as text: markup literal, escapes not obeyed."""
    return ("[/]" in output and "[link=http://127.0.0.9/]" in output and "[bold red]FAKE[/]" in output
            and "\x1b" not in output and "\x9b" not in output and "\\x1b" in output)
