# Registers the equivalence matrix (Matrix/Equivalence.*) as one CTest test per module kind and
# rule-naming variant, e.g. nn.Matrix/MhaGqaRope_TeTable running that kind's ~20 layouts in one
# process. Every process start loads LibTorch (~1 s of CPU on the CI machine, against ~0.1 s per
# case), so one test per case spent most of the suite's time starting processes. A failing group
# prints the failing case's full gtest name; run one case alone with
#   te_nn_tests --gtest_filter='Matrix/Equivalence.*/MhaGqaRope_DP2xTP2_TeTable_BF16'.
#
# Run by CMake in script mode after te_nn_tests links (tests/CMakeLists.txt):
#   cmake -D EXE=<te_nn_tests> -D DIR=<working dir> -D OUT=<file> -D PREFIX=nn. -D TIMEOUT=300
#         -P matrix_groups.cmake
# The case names are <kind>_<layout>_<rules>[_Dropout][_Uneven][_BF16|_FP16] (tests/nn/
# test_parallel.cpp, case_name): the kind, layout and rules hold no '_'.
cmake_minimum_required(VERSION 3.21)
execute_process(COMMAND "${EXE}" --gtest_list_tests "--gtest_filter=Matrix/*"
  OUTPUT_VARIABLE listing RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "matrix_groups: '${EXE} --gtest_list_tests' failed (${status}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(suite "")
set(groups "")
foreach(line IN LISTS lines)
  if(line MATCHES "^(Matrix/[A-Za-z0-9_]+)\\.$")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([A-Za-z0-9_]+)/([A-Za-z0-9]+)_[A-Za-z0-9]+_([A-Za-z0-9]+)(_[A-Za-z0-9_]+)?( |$)")
    if(suite STREQUAL "")
      message(FATAL_ERROR "matrix_groups: case '${line}' before any Matrix suite")
    endif()
    set(group "${CMAKE_MATCH_2}_${CMAKE_MATCH_3}")
    set(filter "${suite}.${CMAKE_MATCH_1}/${CMAKE_MATCH_2}_*_${CMAKE_MATCH_3}*")
    if(NOT group IN_LIST groups)
      list(APPEND groups "${group}")
      set(filter_${group} "${filter}")
      set(count_${group} 0)
    elseif(NOT filter_${group} STREQUAL filter)
      message(FATAL_ERROR "matrix_groups: ${group} spans two test names (${filter_${group}}, ${filter})")
    endif()
    math(EXPR count_${group} "${count_${group}} + 1")
  elseif(line MATCHES "^  ")
    message(FATAL_ERROR "matrix_groups: '${line}' is not <kind>_<layout>_<rules>[_variant]")
  endif()
endforeach()
if(groups STREQUAL "")
  message(FATAL_ERROR "matrix_groups: '${EXE}' lists no Matrix/ cases")
endif()
set(script "# Written by tests/cmake/matrix_groups.cmake from ${EXE}\n")
foreach(group IN LISTS groups)
  string(APPEND script "# ${count_${group}} cases\n"
    "add_test([=[${PREFIX}Matrix/${group}]=] [=[${EXE}]=] [=[--gtest_filter=${filter_${group}}]=])\n"
    "set_tests_properties([=[${PREFIX}Matrix/${group}]=] PROPERTIES TIMEOUT ${TIMEOUT}"
    " WORKING_DIRECTORY [=[${DIR}]=])\n")
endforeach()
file(WRITE "${OUT}" "${script}")
