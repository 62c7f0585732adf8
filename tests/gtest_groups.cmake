# Run after a test binary links (tests/CMakeLists.txt): lists its tests and writes OUT_FILE, a
# ctest file with one test per group of at most GROUP_SIZE tests of one suite, named LABEL.<suite>,
# then LABEL.<suite>.2, .3, ... for its later groups. A test binary takes about a second to start
# (LibTorch registers its operators), which one process per test paid hundreds of times; tests that
# share a process must not depend on a fresh one (every CPU test binary passes run whole). A group
# whose tests all skipped exits with SKIP_CODE (test_main.cpp): reported as skipped, not passed.
# Inputs: TEST_BINARY, LABEL, GROUP_SIZE, SKIP_CODE, WORKING_DIR, TEST_ENV, OUT_FILE.
execute_process(COMMAND "${TEST_BINARY}" --gtest_list_tests
                WORKING_DIRECTORY "${WORKING_DIR}" OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TEST_BINARY} --gtest_list_tests exited ${rc}:\n${listing}")
endif()

set(script "")
set(suite "")
set(members "")
set(part 1)
function(flush_group)
  if(NOT members)
    return()
  endif()
  string(REGEX REPLACE "\\.$" "" name "${suite}")
  if(part GREATER 1)
    set(name "${name}.${part}")
  endif()
  list(JOIN members ":" filter)
  string(APPEND script "add_test([=[${LABEL}.${name}]=] [==[${TEST_BINARY}]==] [==[--gtest_filter=${filter}]==] "
                       "[==[--skip_exit_code=${SKIP_CODE}]==])\n"
                       "set_tests_properties([=[${LABEL}.${name}]=] PROPERTIES WORKING_DIRECTORY [==[${WORKING_DIR}]==] "
                       "LABELS ${LABEL} SKIP_RETURN_CODE ${SKIP_CODE} ENVIRONMENT [==[${TEST_ENV}]==])\n")
  set(script "${script}" PARENT_SCOPE)
endfunction()

# The parameters' comments ("# GetParam() = ...") go before the lines become a list: a ';' or an
# unbalanced '[' in one would split or join list elements.
string(REGEX REPLACE " *#[^\n]*" "" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  if(line MATCHES "^  ([^ ]+)$")
    list(LENGTH members count)
    if(count EQUAL GROUP_SIZE)
      flush_group()
      set(members "")
      math(EXPR part "${part} + 1")
    endif()
    list(APPEND members "${suite}${CMAKE_MATCH_1}")
  elseif(line MATCHES "^([^ ]+\\.)$")
    flush_group()
    set(suite "${CMAKE_MATCH_1}")
    set(members "")
    set(part 1)
  endif()
endforeach()
flush_group()
file(WRITE "${OUT_FILE}" "${script}")
