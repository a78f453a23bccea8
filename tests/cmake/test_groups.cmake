# Registers a GoogleTest executable's cases as one CTest test per suite (<prefix><Suite>, e.g.
# hf.Generate), and the equivalence matrix (Matrix/Equivalence.*) as one per module kind and
# rule-naming variant (e.g. nn.Matrix/MhaGqaRope_TeTable, that kind's ~20 layouts). Every process
# start loads LibTorch (~1 s of CPU on the CI machine, against ~0.1 s for most cases), so one test
# per case spent most of the suite's time starting processes. A failing group prints the failing
# case's full gtest name; run one case alone with its filter, e.g.
#   te_nn_tests --gtest_filter='Matrix/Equivalence.*/MhaGqaRope_DP2xTP2_TeTable_BF16'.
# A group whose every case skipped exits 77 (tests/gtest_main.cpp), which CTest reports
# as skipped; a group where some ran passes, and its output counts the skipped ones.
#
# Run by CMake in script mode after the executable links (te_gtest_groups in
# tests/CMakeLists.txt):
#   cmake -D EXE=<executable> -D DIR=<working dir> -D OUT=<file> -D PREFIX=nn. -D TIMEOUT=300
#         [-D "PROPERTIES=RUN_SERIAL TRUE"] -P test_groups.cmake
# The matrix's case names are <kind>_<layout>_<rules>[_Dropout][_Uneven][_BF16|_FP16]
# (tests/nn/test_parallel.cpp, case_name): the kind, layout and rules hold no '_'.
cmake_minimum_required(VERSION 3.21)
execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "test_groups: '${EXE} --gtest_list_tests' failed (${status}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(suite "")
set(groups "")
# add_case(<group> <filter>): one more case of <group>, whose filter is <filter>.
macro(add_case group filter)
  if(NOT "${group}" IN_LIST groups)
    list(APPEND groups "${group}")
    set(filter_${group} "${filter}")
    set(count_${group} 0)
  elseif(NOT filter_${group} STREQUAL "${filter}")
    message(FATAL_ERROR "test_groups: ${group} spans two filters (${filter_${group}}, ${filter})")
  endif()
  math(EXPR count_${group} "${count_${group}} + 1")
endmacro()
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([A-Za-z0-9_/]+)( |$)")
    set(name "${CMAKE_MATCH_1}")
    if(suite STREQUAL "")
      message(FATAL_ERROR "test_groups: case '${line}' before any suite")
    endif()
    if(suite MATCHES "^Matrix/")
      if(NOT name MATCHES "^([A-Za-z0-9_]+)/([A-Za-z0-9]+)_[A-Za-z0-9]+_([A-Za-z0-9]+)(_[A-Za-z0-9_]+)?$")
        message(FATAL_ERROR "test_groups: '${suite}.${name}' is not <kind>_<layout>_<rules>[_variant]")
      endif()
      add_case("Matrix/${CMAKE_MATCH_2}_${CMAKE_MATCH_3}"
               "${suite}.${CMAKE_MATCH_1}/${CMAKE_MATCH_2}_*_${CMAKE_MATCH_3}*")
    else()
      add_case("${suite}" "${suite}.*")
    endif()
  elseif(NOT line STREQUAL "")
    message(FATAL_ERROR "test_groups: '${line}' is neither a suite nor a case")
  endif()
endforeach()
if(groups STREQUAL "")
  message(FATAL_ERROR "test_groups: '${EXE}' lists no cases")
endif()
set(script "# Written by tests/cmake/test_groups.cmake from ${EXE}\n")
foreach(group IN LISTS groups)
  string(APPEND script "# ${count_${group}} cases\n"
    "add_test([=[${PREFIX}${group}]=] [=[${EXE}]=] [=[--gtest_filter=${filter_${group}}]=])\n"
    "set_tests_properties([=[${PREFIX}${group}]=] PROPERTIES TIMEOUT ${TIMEOUT}"
    " SKIP_RETURN_CODE 77 WORKING_DIRECTORY [=[${DIR}]=] ${PROPERTIES})\n")
endforeach()
file(WRITE "${OUT}" "${script}")
