# Installs headers, libraries, tools and a CMake package: find_package(te CONFIG REQUIRED) then
# target_link_libraries(app PRIVATE te::te).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/te")

install(TARGETS te_core te_sharding te_kernels te_runtime te_distributed te_fp8 te_nn te_gen te_hf
  te_train te_te
  EXPORT teTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY te/include/te modules/include/te gen/include/te hf/include/te
  train/include/te
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT teTargets NAMESPACE te:: DESTINATION ${TE_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/teConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/teConfig.cmake"
  INSTALL_DESTINATION ${TE_INSTALL_CMAKEDIR})
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/teConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES
  "${CMAKE_CURRENT_BINARY_DIR}/teConfig.cmake"
  "${CMAKE_CURRENT_BINARY_DIR}/teConfigVersion.cmake"
  DESTINATION ${TE_INSTALL_CMAKEDIR})
