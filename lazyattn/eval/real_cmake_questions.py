"""Questions of `builtin:real-heldout-cmake` (lazyattn/eval/real.py): (passage, question, acceptable answers).

The passage is "<document>" (the first passage of that manual or release note stating the first answer) or
"<document>#<index>"; a manual is named by its file ("cmake.1", "cmake-buildsystem.7"), a release note by its
version ("release-3.20"). Written by hand from the passages `cmake_text` renders; each answer is a short span of its
passage (an option, a variable, a command, a property, a file, a keyword). Used only for final reporting: nothing
is tuned on it.
"""

QUESTIONS: list[tuple[str, str, list[str]]] = [
    # cmake.1
    (
        "cmake.1",
        "Which cmake option, new in version 3.24, recreates the build tree configuration from scratch?",
        ["--fresh"],
    ),
    (
        "cmake.1",
        "Which cmake option keeps the files that try_compile and try_run calls create?",
        ["--debug-trycompile"],
    ),
    ("cmake.1", "Which trace output format prints each trace line as a separate JSON document?", ["json-v1"]),
    (
        "cmake.1",
        "In cmake's JSON trace, which member gives the stack frame depth tracked across all files of the trace?",
        ["global_frame"],
    ),
    ("cmake.1", "Which value does cmake currently accept for --profiling-format?", ["google-trace"]),
    (
        "cmake.1",
        "Which environment variable sets a default parallel level for cmake --build when the -j option is not given?",
        ["CMAKE_BUILD_PARALLEL_LEVEL"],
    ),
    ("cmake.1", "Which tool restores package references for the Visual Studio generator before a build?", ["NuGet"]),
    ("cmake.1", "Which option of cmake -E compare_files makes it ignore line-ending differences?", ["--ignore-eol"]),
    # ctest.1
    ("ctest.1", "Which environment variable turns on ctest's short progress output?", ["CTEST_PROGRESS_OUTPUT"]),
    ("ctest.1", "Which ctest option sets a time of day at which all tests should stop running?", ["--stop-time"]),
    (
        "ctest.1",
        "Which environment variable makes ctest print the output of failing tests?",
        ["CTEST_OUTPUT_ON_FAILURE"],
    ),
    ("ctest.1", "Which ctest option writes test results in JUnit XML format?", ["--output-junit"]),
    (
        "ctest.1",
        "Besides until-fail and until-pass, which mode does ctest's --repeat option accept?",
        ["after-timeout"],
    ),
    ("ctest.1", "Which environment variable does ctest set in non-interactive mode?", ["DASHBOARD_TEST_FROM_CTEST"]),
    ("ctest.1", "Which library does CTest use to launch test processes?", ["libuv"]),
    (
        "ctest.1",
        "Which ctest option runs the tests in a random order, for example to detect implicit dependencies?",
        ["--schedule-random"],
    ),
    # cpack.1
    (
        "cpack.1",
        "Which configuration file does cpack read from the current directory by default?",
        ["CPackConfig.cmake"],
    ),
    (
        "cpack.1",
        "Which subdirectory does CPack create below its working directory to hold intermediate files?",
        ["_CPack_Packages"],
    ),
    # cmake-buildsystem.7
    (
        "cmake-buildsystem.7",
        "Which variable makes add_library build shared libraries by default?",
        ["BUILD_SHARED_LIBS"],
    ),
    ("cmake-buildsystem.7", "Which library type is loaded as a plugin at runtime and not linked to?", ["MODULE"]),
    (
        "cmake-buildsystem.7",
        "Which generator expression supplies the content of an object library to other targets?",
        ["$<TARGET_OBJECTS:archive>"],
    ),
    (
        "cmake-buildsystem.7",
        "Which property sets the CFBundleIdentifier key of a framework's Info.plist?",
        ["MACOSX_FRAMEWORK_IDENTIFIER"],
    ),
    # cmake-compile-features.7
    (
        "cmake-compile-features.7",
        "Which global property lists all the C++ features known to CMake?",
        ["CMAKE_CXX_KNOWN_FEATURES"],
    ),
    (
        "cmake-compile-features.7",
        "Which flag does CMake add on the GNU compiler when cxx_variadic_templates is required?",
        ["-std=gnu++11"],
    ),
    ("cmake-compile-features.7", "Which policy concerns the default of <LANG>_EXTENSIONS?", ["CMP0128"]),
    # cmake-developer.7
    (
        "cmake-developer.7",
        "Which string is substituted when the data type of a registry query is not supported?",
        ["/REGISTRY-NOTFOUND"],
    ),
    (
        "cmake-developer.7",
        "Which variable tells a find module for Foo not to complain when the package is not found?",
        ["Foo_FIND_QUIETLY"],
    ),
    (
        "cmake-developer.7",
        "Which function can a find module call to handle the standard arguments of find_package?",
        ["find_package_handle_standard_args()"],
    ),
    # cmake-file-api.7
    ("cmake-file-api.7", "What file name does a client's stateful query use?", ["query.json"]),
    ("cmake-file-api.7", "In which directory of the build tree is the file API v1 housed?", ["<build>/.cmake/api/v1/"]),
    (
        "cmake-file-api.7",
        "Which file does CMake write to the v1/reply/ directory as its reply index?",
        ["index-*.json"],
    ),
    # cmake-generator-expressions.7
    (
        "cmake-generator-expressions.7",
        "Which two options of add_custom_command give robust handling of generator expressions in commands?",
        ["VERBATIM and COMMAND_EXPAND_LISTS"],
    ),
    (
        "cmake-generator-expressions.7",
        "What name does the manual give the custom target that prints a generator expression's value for debugging?",
        ["genexdebug"],
    ),
    (
        "cmake-generator-expressions.7",
        "A string ending in which case-sensitive suffix makes $<BOOL:...> evaluate to 0?",
        ["-NOTFOUND"],
    ),
    # cmake-generators.7
    (
        "cmake-generators.7",
        "Which generators produce project files for an auxiliary IDE besides a command-line build tool?",
        ["Extra Generators"],
    ),
    # cmake-language.7
    (
        "cmake-language.7",
        "For maximum portability, in which encoding may a CMake Language source file be written?",
        ["7-bit ASCII"],
    ),
    (
        "cmake-language.7",
        "Before which CMake version was a quoted argument right after another one silently accepted?",
        ["2.8.12"],
    ),
    # cmake-packages.7
    (
        "cmake-packages.7",
        "Under which Windows registry key is the User Package Registry stored?",
        ["HKEY_CURRENT_USER"],
    ),
    (
        "cmake-packages.7",
        "On UNIX platforms, under which directory is the user package registry stored?",
        ["~/.cmake/packages"],
    ),
    (
        "cmake-packages.7",
        "Which compatibility mode does the ClimbingStats example pass when writing its version file?",
        ["AnyNewerVersion"],
    ),
    # cmake-presets.7
    (
        "cmake-presets.7",
        "Which of the two presets files should not be checked into version control?",
        ["CMakeUserPresets.json"],
    ),
    ("cmake-presets.7", "From which preset file version on may presets files include other files?", ["version 4"]),
    (
        "cmake-presets.7",
        "Which preset field names the other presets whose fields a preset takes by default?",
        ["inherits"],
    ),
    (
        "cmake-presets.7",
        "For Visual Studio generators, which preset field gives the platform instead of the generator name?",
        ["architecture"],
    ),
    # cmake-qt.7
    ("cmake-qt.7", "Which Qt tool generates virtual file system content?", ["rcc"]),
    (
        "cmake-qt.7",
        "Which target property lets a library pass uic options on to its consumers?",
        ["INTERFACE_AUTOUIC_OPTIONS"],
    ),
    ("cmake-qt.7", "Which function does KI18n use instead of tr()?", ["tr2i18n()"]),
    # cmake-toolchains.7
    (
        "cmake-toolchains.7",
        "Which CMAKE_SYSTEM_NAME value does the manual use for a Windows Phone target?",
        ["WindowsPhone"],
    ),
    (
        "cmake-toolchains.7",
        "Which value of CMAKE_SYSTEM_NAME targets the Cray Linux Environment?",
        ["CrayLinuxEnvironment"],
    ),
    ("cmake-toolchains.7", "Which SDK is the default device SDK for tvOS?", ["appletvos"]),
    ("cmake-toolchains.7", "Which simulator SDK corresponds to watchOS?", ["watchsimulator"]),
    # release-3.0
    (
        "release-3.0",
        "Into which markup format was the CMake documentation converted in CMake 3.0?",
        ["reStructuredText"],
    ),
    ("release-3.0", "Which new mode did the string command gain in CMake 3.0?", ["CONCAT"]),
    # release-3.1
    ("release-3.1", "Which new command populates the compile features of a target?", ["target_compile_features"]),
    # release-3.2
    (
        "release-3.2",
        "Which option did add_custom_command and add_custom_target learn to request access to the terminal?",
        ["USES_TERMINAL"],
    ),
    (
        "release-3.2",
        "Which subcommand lets CMake processes synchronize through file and directory locks?",
        ["file(LOCK)"],
    ),
    # release-3.3
    (
        "release-3.3",
        "Which special target do the Makefile generators add to the generated files?",
        [".DELETE_ON_ERROR"],
    ),
    (
        "release-3.3",
        "Which generator expression was introduced to set options per compile language?",
        ["COMPILE_LANGUAGE"],
    ),
    # release-3.4
    (
        "release-3.4",
        "Which find_program option considers all given names in each directory before moving to the next directory?",
        ["NAMES_PER_DIR"],
    ),
    # release-3.5
    ("release-3.5", "Which command is now implemented natively in CMake 3.5?", ["cmake_parse_arguments"]),
    # release-3.6
    (
        "release-3.6",
        "Which variable indicates that CMake is running on an Oracle Solaris host?",
        ["CMAKE_HOST_SOLARIS"],
    ),
    # release-3.7
    (
        "release-3.7",
        "Which keyword did cmake_parse_arguments gain in CMake 3.7 to parse a function's arguments directly?",
        ["PARSE_ARGV"],
    ),
    (
        "release-3.7",
        "Which variable controls the order in which find_package sorts candidate packages?",
        ["CMAKE_FIND_PACKAGE_SORT_ORDER"],
    ),
    (
        "release-3.7",
        "Which option did the install command gain to export targets for Android's build system?",
        ["EXPORT_ANDROID_MK"],
    ),
    # release-3.8
    ("release-3.8", "Which Microsoft language did CMake 3.8 learn to support as a first-class language?", ["CSharp"]),
    ("release-3.8", "For which operating system was a new minimal platform file added in CMake 3.8?", ["Fuchsia"]),
    # release-3.9
    ("release-3.9", "Which target property was added to compile CUDA sources to PTX files?", ["CUDA_PTX_COMPILATION"]),
    # release-3.10
    ("release-3.10", "Which command guards CMake scripts from being included more than once?", ["include_guard"]),
    ("release-3.10", "For which environment was a new minimal platform file added in CMake 3.10?", ["Midipix"]),
    # release-3.11
    ("release-3.11", "Which module was added in CMake 3.11 to populate content at configure time?", ["FetchContent"]),
    (
        "release-3.11",
        "Which variable was added to specify a default job pool for the Ninja generator?",
        ["CMAKE_JOB_POOLS"],
    ),
    # release-3.12
    (
        "release-3.12",
        "Which command sets preprocessor definitions at directory level and supersedes add_definitions?",
        ["add_compile_definitions"],
    ),
    (
        "release-3.12",
        "Which flag of file(GLOB) expresses that the build should re-run CMake when the glob result changes?",
        ["CONFIGURE_DEPENDS"],
    ),
    # release-3.13
    (
        "release-3.13",
        "Which command was created in CMake 3.13 to add link directories to a target?",
        ["target_link_directories"],
    ),
    ("release-3.13", "Which option did FindBoost gain in CMake 3.13 for the architecture tag?", ["Boost_ARCHITECTURE"]),
    # release-3.14
    ("release-3.14", "Which Visual Studio generator was added in CMake 3.14?", ["Visual Studio 16 2019"]),
    ("release-3.14", "Which file sub-command determines the path that a symlink points to?", ["READ_SYMLINK"]),
    # release-3.15
    (
        "release-3.15",
        "Which target property lists additional files to remove in the clean target?",
        ["ADDITIONAL_CLEAN_FILES"],
    ),
    # release-3.16
    (
        "release-3.16",
        "Which file sub-command recursively gets the list of libraries a binary depends on?",
        ["GET_RUNTIME_DEPENDENCIES"],
    ),
    # release-3.17
    (
        "release-3.17",
        "Which generator did CMake 3.17 gain for building several configurations with Ninja?",
        ["Ninja Multi-Config"],
    ),
    (
        "release-3.17",
        "Which variable gives a list of arguments to pass to ctest when running tests through the test target?",
        ["CMAKE_CTEST_ARGUMENTS"],
    ),
    # release-3.18
    (
        "release-3.18",
        "Which command was added in 3.18 for meta-operations on scripted or built-in commands?",
        ["cmake_language()", "cmake_language"],
    ),
    (
        "release-3.18",
        "Which policy makes the export command raise an error when used twice with the same FILE without APPEND?",
        ["CMP0103"],
    ),
    # release-3.19
    (
        "release-3.19",
        "Which option did configure_file gain in 3.19 so that the output does not take the input's permissions?",
        ["NO_SOURCE_PERMISSIONS"],
    ),
    ("release-3.19", "Which file sub-command was added to compute a path with symlinks resolved?", ["REAL_PATH"]),
    (
        "release-3.19",
        "Which target property enables instantiating templates when building a precompiled header?",
        ["PCH_INSTANTIATE_TEMPLATES"],
    ),
    # release-3.20
    ("release-3.20", "Which environment variable initializes CMAKE_CUDA_ARCHITECTURES?", ["CUDAARCHS"]),
    ("release-3.20", "Which compiler id does Intel's LLVM-based compiler have?", ["IntelLLVM"]),
    # release-3.21
    ("release-3.21", "Which language did CMake 3.21 learn to support as a first-class language?", ["HIP"]),
    ("release-3.21", "Which cmake option sets the install prefix, added in 3.21?", ["--install-prefix"]),
    (
        "release-3.21",
        "Which new signature did the install command gain in 3.21 to install runtime artifacts of imported targets?",
        ["IMPORTED_RUNTIME_ARTIFACTS"],
    ),
    # release-3.22
    (
        "release-3.22",
        "From which file can cmake_host_system_information query OS identification variables?",
        ["/etc/os-release"],
    ),
    (
        "release-3.22",
        "Which environment variable tells install rules implemented by file(INSTALL) how to install files?",
        ["CMAKE_INSTALL_MODE"],
    ),
    # release-3.23
    ("release-3.23", "Which IBM compiler based on LLVM is now supported?", ["IBM Open XL C/C++"]),
    ("release-3.23", "Which target property embeds plugins in an Xcode app bundle?", ["XCODE_EMBED_PLUGINS"]),
    # release-3.24
    ("release-3.24", "Which macro do presets files support for the path list separator?", ["${pathListSep}"]),
    ("release-3.24", "Which test preset field specifies how test output is truncated?", ["testOutputTruncation"]),
    # release-3.25
    (
        "release-3.25",
        "Which two commands were added in 3.25 to manage a scope of variables and policies?",
        ["block and endblock"],
    ),
    ("release-3.25", "Which meta-feature does CMake 3.25 define for C++26?", ["cxx_std_26"]),
    ("release-3.25", "Which presets field specifies JUnit output in test presets?", ["outputJUnitFile"]),
]
