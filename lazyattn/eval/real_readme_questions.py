"""Questions of `builtin:real-heldout-readme` (lazyattn/eval/real.py): (passage, question, acceptable answers).

The passage is "<package>" (the first passage of that package's README stating the first answer) or
"<package>#<index>". Written by hand from the passages; each answer is a short span of its passage. Used only
for final reporting: nothing is tuned on it.
"""

QUESTIONS: list[tuple[str, str, list[str]]] = [
    # rich
    ("rich", "Which library does Rich use to implement syntax highlighting?", ["pygments"]),
    ("rich", "From which project were Rich's spinner animations borrowed?", ["cli-spinners"]),
    ("rich#14", "What is the name of Rich's sister project for building user interfaces in the terminal?", ["Textual"]),
    (
        "rich",
        "Which argument of the log method outputs a table of the local variables where it was called?",
        ["log_locals"],
    ),
    ("rich", "Rich renders a special markup similar in syntax to what?", ["bbcode"]),
    ("rich", "Which Python version or later does Rich require?", ["Python 3.8"]),
    ("rich", "How many colors is the classic Windows terminal limited to when using Rich?", ["16 colors"]),
    ("rich", "Which protocol do all Rich renderables make use of?", ["Console Protocol"]),
    ("rich", "To insert an emoji into Rich console output, where do you place its name?", ["between two colons"]),
    # typer
    ("typer", "Typer is described as the little sibling of which web framework?", ["FastAPI"]),
    (
        "typer",
        "Which dependency does Typer use to automatically detect the current shell when installing completion?",
        ["shellingham"],
    ),
    ("typer", "Since which version has Typer vendored Click?", ["0.26.0"]),
    ("typer", "Which environment variable disables Rich globally in Typer?", ["TYPER_USE_RICH"]),
    (
        "typer",
        "What was the slimmed-down variant of Typer without the rich and shellingham dependencies called?",
        ["typer-slim"],
    ),
    ("typer", "Which Windows-only dependency of Typer produces colored terminal text?", ["colorama"]),
    ("typer", "Which dependency does Typer use to validate input parameters?", ["pydantic"]),
    ("typer#9", "Which command-line option installs completion for the current shell?", ["--install-completion"]),
    # python-dotenv
    ("python-dotenv", "Which application design principles does python-dotenv help to follow?", ["12-factor"]),
    (
        "python-dotenv",
        "Which function returns a dict of the values parsed from a .env file without touching the environment?",
        ["dotenv_values"],
    ),
    (
        "python-dotenv",
        "Which environment variable stops load_dotenv() from loading .env files?",
        ["PYTHON_DOTENV_DISABLED"],
    ),
    ("python-dotenv", "What must be passed to load_dotenv to override existing variables?", ["override=True"]),
    ("python-dotenv", "Which IPython magic command loads the dotenv extension?", ["%load_ext dotenv"]),
    ("python-dotenv", "Which option makes the dotenv list command print JSON?", ["--format=json"]),
    (
        "python-dotenv",
        "Which IDEs on Windows may save a .env file with a UTF-8 BOM, according to the changelog?",
        ["JetBrains"],
    ),
    (
        "python-dotenv",
        "To which file mode did set_key and unset_key use to reset the modified .env file?",
        ["0o600"],
    ),
    ("python-dotenv", "In which version was support for reading .env from FIFOs added?", ["1.2.1"]),
    # smart_open
    ("smart_open", "Which Amazon Python library does smart_open use to talk to S3?", ["boto3"]),
    ("smart_open", "What is the default value of smart_open's compression parameter?", ["infer_from_extension"]),
    (
        "smart_open#11",
        "Which keyword argument of smart_open's open function passes additional parameters to the transport layer?",
        ["transport_params"],
    ),
    ("smart_open", "Which package does HTTP Kerberos authentication in smart_open need?", ["requests-kerberos"]),
    ("smart_open#10", "Which function adds support for another compression file extension?", ["register_compressor"]),
    ("smart_open", "Which keyword does the xz library use where gzip uses compresslevel?", ["preset"]),
    ("smart_open", "Which pip install target installs every optional dependency of smart_open?", ["smart_open[all]"]),
    # psutil
    ("psutil", "What does the name psutil stand for?", ["process and system utilities"]),
    ("psutil", "Which is the latest psutil version supporting Python 2.7?", ["6.1.1"]),
    ("psutil", "Which psutil function returns swap memory statistics?", ["swap_memory"]),
    ("psutil", "Which psutil function lists the mounted disk partitions?", ["disk_partitions"]),
    ("psutil", "Which Sun operating system does psutil support?", ["Solaris"]),
    # pytest-timeout
    (
        "pytest-timeout",
        "Which signal must the system support for the signal timeout method to be the default?",
        ["SIGALRM"],
    ),
    (
        "pytest-timeout",
        "Which environment variable sets a global timeout that overrides the configuration file?",
        ["PYTEST_TIMEOUT"],
    ),
    ("pytest-timeout", "Setting the timeout to what disables it?", ["0 seconds"]),
    ("pytest-timeout#4", "Which timeout method is the surest and most portable?", ["thread"]),
    ("pytest-timeout", "Which function does the signal method use to interrupt the test?", ["pytest.fail()"]),
    (
        "pytest-timeout",
        "Which hard termination call leaves no teardown and no JUnit XML output?",
        ["os._exit()"],
    ),
    (
        "pytest-timeout",
        "Which option of another pytest plugin may alleviate the thread method's second issue?",
        ["--forked"],
    ),
    (
        "pytest-timeout",
        "Which configuration file option chooses between the thread and signal methods?",
        ["timeout_method"],
    ),
    # colorful
    ("colorful", "Which environment variable makes a process use no coloring at all?", ["COLORFUL_DISABLE"]),
    ("colorful#6", "Which palette is colorful's default color palette?", ["X11 rgb.txt"]),
    ("colorful", "Which library does colorful use to support Windows?", ["colorama"]),
    ("colorful", "Which constant selects the 24bit true color mode?", ["cf.TRUE_COLORS"]),
    ("colorful", "Which function extends colorful's default color palette?", ["update_palette"]),
    ("colorful", "Which predefined style prints the official colors in colorful's example?", ["solarized"]),
    # httpcore
    ("httpcore", "Besides asyncio, which async backend does HTTP Core support?", ["trio"]),
    ("httpcore", "Which higher level client library does the HTTP Core README suggest using instead?", ["httpx"]),
    ("httpcore", "Which package is required by the http2 extra of HTTP Core?", ["h2"]),
    ("httpcore", "Which package is required by the socks extra of HTTP Core?", ["socksio"]),
    ("httpcore", "Which release fixed an AttributeError when importing on Python 3.14?", ["1.0.8"]),
    ("httpcore", "Which versioning policy does HTTP Core follow?", ["SEMVER"]),
    ("httpcore", "Which class provides HTTP Core's connection pooling?", ["ConnectionPool"]),
    # pyrate-limiter
    ("pyrate-limiter", "Which Python version does PyrateLimiter require at least?", ["Python 3.10"]),
    ("pyrate-limiter", "Which algorithm is PyrateLimiter's exact default?", ["sliding-window log"]),
    (
        "pyrate-limiter",
        "Which classic algorithm does a GCRA bucket implement by leaking at a constant rate?",
        ["Leaky Bucket"],
    ),
    ("pyrate-limiter#5", "Which component routes each key to its bucket?", ["BucketFactory"]),
    ("pyrate-limiter#10", "Which Limiter method blocks by default until a permit frees up?", ["try_acquire"]),
    ("pyrate-limiter", "Which exception do ill-formed lists of rates raise at construction?", ["ValueError"]),
    ("pyrate-limiter", "Which bucket class does the GCRA algorithm need?", ["StateBucket"]),
    ("pyrate-limiter", "What runs the Redis state transition atomically across clients?", ["Lua script"]),
    ("pyrate-limiter", "Which clock does RedisStateStore default the bucket to?", ["WallClock"]),
    ("pyrate-limiter", "Which clock do local stores default to?", ["MonotonicClock"]),
    # charset-normalizer
    ("charset-normalizer#3", "Which package is charset-normalizer said to be faster than?", ["Chardet"]),
    ("charset-normalizer", "How many files were the performance statistics generated with?", ["477 files"]),
    (
        "charset-normalizer",
        "Which flag of the normalizer CLI outputs only the detected charset to STDOUT?",
        ["--minimal"],
    ),
    ("charset-normalizer", "Since which version does the CLI produce its result in JSON format?", ["1.4.0"]),
    (
        "charset-normalizer#7",
        "Which function can be imported to behave the same as chardet?",
        ["detect"],
    ),
    ("charset-normalizer", "Which encoding is detected for the French subtitle file in the CLI example?", ["cp1252"]),
    # annotated-types
    ("annotated-types", "Which metadata object sets only a lower bound on a length?", ["MinLen"]),
    ("annotated-types", "Which marker does annotated-types provide for runtime checks?", ["Predicate"]),
    ("annotated-types#5", "What has max_exclusive been renamed to?", ["max_length"]),
    ("annotated-types", "Besides astropy.units, which library is named to parse the unit string?", ["pint"]),
    (
        "annotated-types",
        "Which metadata object specifies an upper and a lower bound in a single object?",
        ["Interval"],
    ),
    ("annotated-types", "Which timezone string is the example of allowing one specific timezone?", ["Africa/Abidjan"]),
    ("annotated-types", "What must an Annotated[datetime, Timezone(None)] value be?", ["naive datetime"]),
]
