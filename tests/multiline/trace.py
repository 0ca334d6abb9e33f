"""Prints a line, a real chained Python traceback (as logging.exception writes it), and a line:
the multiline test (tests/it/multiline.rs) sends this output to a `lines` listener with
`preset = "python"`."""

import logging
import sys

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
log = logging.getLogger("app")
log.info("python before")
try:
    try:
        {}["missing"]
    except KeyError as error:
        raise ValueError("bad request") from error
except ValueError:
    log.exception("python failed")
log.info("python after")
