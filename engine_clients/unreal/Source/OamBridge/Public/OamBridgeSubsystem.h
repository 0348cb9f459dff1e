// OamBridgeSubsystem.h - one oam-bridge process per game instance, for Blueprints and C++.
#pragma once

#include "CoreMinimal.h"
#include "Subsystems/GameInstanceSubsystem.h"
#include "Templates/UniquePtr.h"

#include "OamBridgeSubsystem.generated.h"

OAMBRIDGE_API DECLARE_LOG_CATEGORY_EXTERN(LogOamBridge, Log, All);

namespace oam
{
class Client;
}

// All four are broadcast on the game thread.
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FourParams(FOamTextDeltaSignature, const FString&, NpcId, const FString&, TurnId,
	const FString&, Delta, bool, bIsReset);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FiveParams(FOamToolCallRequestedSignature, const FString&, NpcId,
	const FString&, TurnId, const FString&, CallId, const FString&, ToolName, const FString&, ArgumentsJson);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FourParams(FOamTurnCompletedSignature, const FString&, NpcId, const FString&,
	TurnId, const FString&, Text, const FString&, CompletedJson);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FourParams(FOamTurnFailedSignature, const FString&, NpcId, const FString&, TurnId,
	const FString&, Code, const FString&, Message);

UCLASS(Config = Game)
class OAMBRIDGE_API UOamBridgeSubsystem : public UGameInstanceSubsystem
{
	GENERATED_BODY()

public:
	UOamBridgeSubsystem();
	virtual ~UOamBridgeSubsystem() override;

	virtual void Initialize(FSubsystemCollectionBase& Collection) override;
	virtual void Deinitialize() override;

	/** npc/create. ExtraParamsJson: further npc/create params as a JSON object (tools, persona, engine, script, ...). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "ExtraParamsJson"))
	bool CreateNpc(const FString& NpcId, const FString& Instructions, const FString& ExtraParamsJson = TEXT(""));

	/** npc/respond. Streams OnTextDelta / OnToolCallRequested, then OnTurnCompleted or OnTurnFailed (also when the request is refused, with an empty TurnId). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "OptionsJson"))
	bool Respond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson = TEXT(""));

	/** npc/submit with an output (OutputJson: any JSON value). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SubmitToolOutput(const FString& NpcId, const FString& CallId, const FString& OutputJson);

	/** npc/submit with an error the model sees. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SubmitToolError(const FString& NpcId, const FString& CallId, const FString& Error);

	/** npc/cancel: the running and queued turns end with OnTurnFailed (Code "cancelled"). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool Cancel(const FString& NpcId);

	/** npc/transcript as JSON text for the save game ("" on failure). Blocks up to RequestTimeoutSeconds. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	FString SaveTranscript(const FString& NpcId);

	/** npc/restore from SaveTranscript's text; NpcId empty keeps the saved id. Blocks up to RequestTimeoutSeconds. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool RestoreTranscript(const FString& SaveJson, const FString& NpcId = TEXT(""));

	UFUNCTION(BlueprintPure, Category = "OAM Bridge")
	bool IsBridgeRunning() const;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamTextDeltaSignature OnTextDelta;

	/** Answer with SubmitToolOutput / SubmitToolError, unless a C++ handler is registered for the tool (GetClient()->registerTool), which answers by itself. */
	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamToolCallRequestedSignature OnToolCallRequested;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamTurnCompletedSignature OnTurnCompleted;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamTurnFailedSignature OnTurnFailed;

	/** The bridge command line; the environment variable OAM_BRIDGE_CMD overrides it. */
	UPROPERTY(Config, EditAnywhere, Category = "OAM Bridge")
	FString BridgeCommand = TEXT("python -m bridge");

	/** Working directory of the bridge, relative to the project directory. */
	UPROPERTY(Config, EditAnywhere, Category = "OAM Bridge")
	FString BridgeWorkingDirectory;

	UPROPERTY(Config, EditAnywhere, Category = "OAM Bridge")
	float RequestTimeoutSeconds = 5.f;

	/** The core client for C++ (tool handlers, other methods); null when the bridge did not start. */
	oam::Client* GetClient() const { return Client.Get(); }

private:
	TUniquePtr<oam::Client> Client;
	bool bClosing = false;
};
